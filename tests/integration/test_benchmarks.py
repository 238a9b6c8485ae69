"""CI smoke runs of every benchmark: tiny settings, valid JSON with the documented fields.

No figure is asserted (speed and memory are machine-dependent; see benchmarks/README.md for
measured numbers); only that each script runs end to end and reports what it promises.
"""


from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))


def _run_here(script: str, *args: str) -> dict:
    """Run a benchmark script as ``__main__`` in this process (torch and transformers are imported
    already, which saves each script the seconds of a fresh interpreter); its printed JSON."""
    import contextlib
    import io
    import runpy
    from unittest import mock

    out = io.StringIO()
    with mock.patch.object(sys, "argv", [script, *args]), contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
    return json.loads(out.getvalue())


def _run(script: str, *args: str) -> dict:
    """Run a benchmark script in a fresh process (for those that measure their own process or start servers)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and v > 0 for v in values)


def test_every_benchmark_has_a_smoke_test_and_a_readme_entry():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    for script in SCRIPTS:
        assert script in readme, f"benchmarks/README.md does not describe {script}"
    # xla_lowering.py, decode_cost.py and verify_cost.py need torch-xla: their smoke tests are in tests/xla/ (the
    # xla virtualenv)
    tested = {"host_overhead.py", "decode_vs_hf.py", "kv_memory.py", "slim_rss.py", "host_step.py", "cpu_backend.py",
              "xla_lowering.py", "decode_cost.py", "serve_bench.py", "bf16_accuracy.py", "weights_once.py", "nxd_build_memory.py",
              "lm_eval_parity.py", "int8_accuracy.py", "shard_vs_plan.py", "call_path.py",
              "speculative_lookup.py", "verify_cost.py"}
    assert set(SCRIPTS) <= tested, f"no smoke test for {set(SCRIPTS) - tested}"


@pytest.mark.slow
def test_host_overhead_smoke():
    out = _run_here("host_overhead.py", "--smoke", "--json")
    assert out["device_step_ms_anchor"] == 23.0
    assert _positive(out["greedy_ms_per_token"], out["sampled_ms_per_token"], out["greedy_ratio_to_anchor"],
                     out["sampled_ratio_to_anchor"], out["peer_greedy_ms_per_token"], out["peer_sampled_ms_per_token"])


@pytest.mark.slow
def test_decode_vs_hf_smoke():
    out = _run_here("decode_vs_hf.py", "--smoke", "--json")
    assert [r["context"] for r in out["results"]] == [16, 32]
    for row in out["results"]:
        assert {"variant", "context", "port_tok_per_s", "hf_tok_per_s", "ratio"} <= set(row)
        assert _positive(row["port_tok_per_s"], row["hf_tok_per_s"], row["ratio"])
    assert set(out["flatness"]) == {"tiny"}


def test_kv_memory_smoke_with_plot(tmp_path):
    png = tmp_path / "kv.png"
    out = _run_here("kv_memory.py", "--smoke", "--json", "--plot", str(png))
    assert set(out["results"]) == {"gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"}
    for rows in out["results"].values():
        for row in rows:
            assert row["owners_rings"] <= row["owners_full"] <= row["every_layer_full"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_slim_rss_smoke():
    out = _run("slim_rss.py", "--smoke", "--json")
    assert _positive(out["embedding_bytes"], out["full_model_bytes_bf16"], out["peak_rss_bytes"],
                     out["peak_over_embedding_bytes"], out["peer_over_library_peak"])
    assert out["library"]["embedding_bytes"] == out["embedding_bytes"]


@pytest.mark.slow
def test_host_step_smoke():
    out = _run_here("host_step.py", "--vocab", "4096", "--kv-len", "256", "--window", "64", "--repeats", "2",
                    "--bucket", "64", "--store-kv-len", "512")
    assert _positive(out["sampling_ms"]["library_topk_topp"], out["decode_host_inputs_ms"]["preallocated"])
    payload = out["step_payload"]
    assert (payload["bucket"], payload["kv_len"]) == (64, 512)
    # the maps the graphs build are no longer sent: a step sends less than its host-built maps took
    for step in ("prefill", "decode"):
        assert 0 < payload[step]["library_bytes"] < payload[step]["host_maps_bytes"]


@pytest.mark.slow
def test_cpu_backend_smoke():
    out = _run_here("cpu_backend.py", "--tokens", "4", "--repeats", "1")
    assert _positive(out["ratio_eager_over_compiled"]) and out["same_tokens"] is True


@pytest.mark.slow
def test_serve_bench_smoke():
    pytest.importorskip("fastapi")
    pytest.importorskip("guidellm")
    out = _run("serve_bench.py", "--models", "tiny-e2b", "--smoke", "--json")
    result = out["results"][0]
    assert result["errored"] == 0 and _positive(result["one_stream"]["itl_p50_8_over_1"])
    for batching in ("continuous", "static"):
        points = result["sweeps"][batching]
        assert [(p["profile"], p["point"]) for p in points] == [("concurrent", 1), ("concurrent", 4), ("poisson", 1.0)]
        assert all(_positive(p["ttft_p50_ms"], p["itl_p50_ms"], p["output_tok_s"]) for p in points)
    assert all(_positive(r["ttft_p50_static_over_continuous"], r["tok_s_continuous_over_static"]) for r in result["ratios"])


@pytest.mark.slow
def test_bf16_accuracy_smoke(smollm2_dir):
    out = _run_here("bf16_accuracy.py", "--smoke", "--json")
    (row,) = out["results"]
    assert row["model"] == "smollm2-135m" and row["prompts"] == 2 and row["new_tokens"] == 4
    for dtype in ("bf16", "fp32"):
        assert 0 <= row[dtype]["identical_share"] <= 1 and row[dtype]["logit_error"]["steps"] == 8
    # the control is float32, the measured side really bf16
    assert row["fp32"]["logit_error"]["max"] < 1e-4 < row["bf16"]["logit_error"]["max"]


@pytest.mark.slow
def test_int8_accuracy_smoke(smollm2_dir):
    out = _run_here("int8_accuracy.py", "--smoke", "--json")
    (row,) = out["results"]
    assert row["model"] == "smollm2-135m" and row["prompts"] == 2 and row["new_tokens"] == 4 and row["ppl_tokens"] == 256
    for side in ("int8", "int8_bf16", "bf16", "quanto_int8", "int8_head", "quanto_int8_head"):
        assert 0 <= row[side]["identical_share"] <= 1 and row[side]["logit_error"]["steps"] == 8
        assert 1 < row[side]["perplexity"] < 1e3
    # the port's int8 computes the quantized model exactly, and the quantization really changed the logits
    assert row["int8_exact"]["max_logit_error"] < 1e-4 < row["int8"]["logit_error"]["max"]
    assert row["int8_head_exact"]["max_logit_error"] < 1e-4 and 0.9 < row["int8_head_to_peer_perplexity_ratio"] < 1.1
    assert row["int8"]["perplexity"] != row["reference_perplexity"]


def test_speculative_lookup_smoke(smollm2_dir):
    out = _run_here("speculative_lookup.py", "--models", "smollm2-135m", "--prompts", "1", "--new-tokens", "8", "--json")
    (model,) = out["models"]
    assert model["prompts"][0]["drafted"] > 0 and _positive(model["plain_tok_per_s"], model["speculative_tok_per_s"])
    assert 0 <= model["acceptance_rate"] <= 1 and model["tokens_per_step"] >= 1


def test_call_path_smoke(tiny_e2b_artifact):
    out = _run("call_path.py", "--rev", "HEAD", "--", "generate", str(tiny_e2b_artifact), "--prompt-len", "6",
               "--max-new-tokens", "2", "--json")
    now, then = out["trees"]
    assert now["exit_code"] == then["exit_code"] == 0 and then["tree"] == "HEAD"
    assert _positive(now["modules_entered"], now["calls"], then["modules_entered"], out["ratio"]["calls"])
    assert set(now["call_sites"]) == {"family_for", "family_of", "describe", "load_config"}
    assert now["largest_module"]["lines"] <= 400 and now["largest_class"]["lines"] > 0


def test_nxd_build_memory_smoke():
    out = _run("nxd_build_memory.py", "--smoke", "--json")
    assert out["graph_keys"] == 2 and _positive(out["weight_bytes"], out["library_build_added_bytes"],
                                                 out["peer_build_added_bytes"], out["library_to_peer"])


def test_shard_vs_plan_smoke():
    out = _run("shard_vs_plan.py", "--smoke", "--json")
    assert out["layers"] == 2 and out["tp"] == 2 and len(out["shard_bytes_per_core"]) == 2
    assert _positive(out["plan_weight_bytes_per_core"], out["full_plan_weight_bytes_per_core"], out["peak_rss_bytes"])
    assert out["full_plan_weight_bytes_per_core"] > out["plan_weight_bytes_per_core"]  # the cut config is the smaller


def test_weights_once_on_real_weights(smollm2_dir):
    """The issue's must-show: a SmolLM2 artifact with four buckets is the weights plus code, and
    generating from it holds about what Hugging Face's from_pretrained + generate holds."""
    out = _run("weights_once.py", "--models", "smollm2-135m", "--new-tokens", "4", "--json")
    (row,) = out["models"]
    assert row["graphs"] == 5 and row["weights_bytes"] > 5e8
    assert row["artifact_over_weights"] <= 1.15
    assert row["rss_over_peer"] <= 1.3


@pytest.mark.slow
def test_lm_eval_parity_smoke(smollm2_dir):
    """lm-evaluation-harness's own command, --model local-completions against the served SmolLM2 (its
    default token-list requests; echo with logprobs for the multiple-choice task) and --model hf."""
    pytest.importorskip("lm_eval", reason="needs the bench extra (pip install -e '.[bench]'; CI installs it)")
    out = _run("lm_eval_parity.py", "--smoke", "--json")
    rows = {row["task"]: row for row in out["results"]}
    assert set(rows) == {"np_capitals", "np_arithmetic"} and all(row["items"] == 4 for row in rows.values())
    assert rows["np_capitals"]["max_loglikelihood_diff"] < 1e-3 and rows["np_capitals"]["port"] == rows["np_capitals"]["hf"]
    assert rows["np_arithmetic"]["same_generation"] == 1.0

