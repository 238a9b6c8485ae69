"""What the deployable artifact carries on the nxd and neuron backends, end to end on the stand-in Neuron SDK
(``tests/support/sdk_standin``; a contract test, not a hardware result): int8 projections (NxD's quantized
layers) with and without an int8 LM head, at tp 1, 2 and 4, and a real checkpoint at tp 1 and 3. Each is
compiled in one process and checked by ``generate DIR --check`` in another, against Hugging Face's forward of
the same model (quantized as the library quantizes it); beyond tp 1 the stand-in runs every core's graph at
once, each on its own shard, meeting at the all-reduces. A planted fault in each feature fails that check,
and the stand-in refuses a checkpoint that would change an int8 weight's or an fp32 scale's values on the
way in. Biased and fused projections and the tp 2 faults: ``test_nxd_artifact_tp.py``. NxD's real layers run
the same pieces at tp 2 and 4 in ``tests/nxd/test_nxd_source.py``."""

from __future__ import annotations

import json

import pytest

from tests.helpers import (
    STANDIN_SHAPE,
    TIGHT,
    compile_on_standin,
    compile_with_planted_checkpoint,
    generate_on_standin,
    run_cli_process,
    shard_dtypes,
    standin_env,
)

SHAPE = STANDIN_SHAPE


INT8 = ["--quant", "int8"]
INT8_HEAD = ["--quant", "int8", "--quant-head"]


@pytest.mark.parametrize("name,backend,tp,quant", [("gemma-4-e2b", "neuron", 1, INT8), ("gemma-4-e2b", "neuron", 1, INT8_HEAD),
                                                   ("gemma-4-e4b", "nxd", 2, INT8), ("gemma-4-e4b", "nxd", 2, INT8_HEAD),
                                                   ("gemma-4-12b", "nxd", 2, INT8), ("gemma-4-12b", "nxd", 2, INT8_HEAD),
                                                   ("gemma-4-12b", "nxd", 4, INT8_HEAD)])
def test_an_int8_artifact_generates_the_quantized_models_tokens_from_a_fresh_process(name, backend, tp, quant, tmp_path):
    summary = compile_on_standin(tmp_path / "A", name, backend, "--tp", str(tp), *quant)
    assert summary["quant"] == ("int8+head" if "--quant-head" in quant else "int8")
    # the planner's int8 bytes per core against every core's shard
    assert len(summary["shard_bytes_per_core"]) == tp and abs(summary["shard_to_plan"] - 1) < 0.02, summary
    assert len(set(summary["shard_bytes_per_core"])) == 1, summary
    for core in range(tp):
        dtypes = shard_dtypes(tmp_path / "A", core)
        projections = {k: v for k, v in dtypes.items() if k.endswith("_proj.weight")}
        assert projections and set(projections.values()) == {"I8"}
        assert {v for k, v in dtypes.items() if k.endswith(".scale")} == {"F32"}
        assert dtypes["graph.model.lm_head.weight"] == ("I8" if "--quant-head" in quant else "F32")
    out = generate_on_standin(tmp_path / "A")
    assert out["backend"] == backend and out["tp"] == tp
    assert out["seq_match"] is True and out["self_checks_passed"] is True
    assert out["logit_check"]["max_relative_error"] < TIGHT, out["logit_check"]
    checks = {c["name"]: c for c in out["self_checks"]}
    # random weights: the drift from the float32 model is reported, not judged (its bound is a real checkpoint's)
    assert checks["quant-drift"]["status"] == "skip" and out["quant_check"]["max_relative_error"] > 10 * TIGHT


@pytest.mark.parametrize("name,quant,plant", [
    ("gemma-4-e2b", "int8", "state.update({k: torch.ones_like(v) for k, v in state.items() if k.endswith('_proj.scale')})"),
    ("gemma-4-e2b", "int8+head", "state['lm_head.scale'] = torch.ones_like(state['lm_head.scale'])"),
    ("qwen2", "none", "state.update({k: torch.zeros_like(v) for k, v in state.items() if k.endswith('.bias')})"),
])
def test_the_check_fails_when_a_feature_is_dropped(name, quant, plant, tmp_path):
    """Scales that are never applied, an int8 head without its scale, biases dropped: each compiles (the
    shapes and dtypes are right) and each fails the logits check against Hugging Face."""
    flags = {"none": [], "int8": ["--quant", "int8"], "int8+head": ["--quant", "int8", "--quant-head"]}[quant]
    res = compile_with_planted_checkpoint(plant, name, "--tiny", "--backend", "nxd", *SHAPE, *flags, "--out",
                                          str(tmp_path / "A"))
    assert res.returncode == 0, res.stderr[-2000:]
    out = generate_on_standin(tmp_path / "A")
    assert out["self_checks_passed"] is False
    assert out["logit_check"]["max_relative_error"] > out["logit_check"]["tolerance"]


@pytest.mark.parametrize("plant,refusal", [
    ("state.update({k: v.to(torch.bfloat16) for k, v in state.items() if k.endswith('_proj.scale')})", "would change its values"),
    ("state.update({k: v.float() for k, v in state.items() if k.endswith('_proj.weight')})", "would change its values"),
])
def test_the_stand_in_refuses_a_checkpoint_that_changes_int8_values(plant, refusal, tmp_path):
    """A scale narrowed to bf16 (its precision gone before NxD's cast back to fp32) and an int8 weight handed
    over as float (NxD's cast to int8 would truncate it): refused, nothing left behind."""
    res = compile_with_planted_checkpoint(plant, "gemma-4-e2b", "--tiny", "--backend", "nxd", *SHAPE, "--quant", "int8",
                                          "--out", str(tmp_path / "A"))
    assert res.returncode != 0 and refusal in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "A").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend,tp", [("neuron", 1), ("nxd", 3)])
def test_a_real_checkpoint_in_int8_is_judged_within_the_measured_bound(smollm2_dir, backend, tp, tmp_path):
    """SmolLM2-135M in int8 through the neuron artifact (one core) and the nxd artifact at tp 3 (its 9 q / 3 kv
    heads: one KV head per core), prompted with text: Hugging Face's greedy tokens of the same int8 model, and
    quant-drift judged (a real checkpoint) against the float32 model within the bound
    benchmarks/int8_accuracy.py measured; every core's shard is the planner's bytes to the byte."""
    out = tmp_path / "smol"
    res = run_cli_process("compile", str(smollm2_dir), "--backend", backend, "--tp", str(tp), "--quant", "int8",
                          "--buckets", "16", "--kv-lens", "64", "--out", str(out), "--json", env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert len(summary["shard_bytes_per_core"]) == tp and summary["shard_to_plan"] == 1.0, summary
    res = run_cli_process("generate", str(out), "--prompt", "The capital of France is", "--max-new-tokens", "12",
                          "--check", "--json", env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    checked = json.loads(res.stdout)
    drift = {c["name"]: c for c in checked["self_checks"]}["quant-drift"]
    assert checked["tp"] == tp and checked["seq_match"] is True and checked["self_checks_passed"] is True
    assert drift["status"] == "pass"
    assert checked["logit_check"]["max_relative_error"] < TIGHT
    assert 0 < checked["quant_check"]["max_relative_error"] <= checked["quant_check"]["tolerance"]
    assert checked["text"].startswith(" Paris")
