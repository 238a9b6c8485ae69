"""Adapters from pip-installed packages (the ``neuron_port.families`` entry-point group).

The fixture packages under ``tests/support/plugins/`` are installed with pip into a folder of their own
and put on ``PYTHONPATH`` of fresh processes, as a user's environment would have them: the
command, gloo ranks, artifacts (and their fresh-process check) and the server must all find
the adapter, and ``port --check``'s self-checks must catch the classic mistakes of
``gemma-mistakes``, each one adapter that replaces a shipped one.
"""


import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from tests.helpers import ServerProcess, run_cli, run_cli_commands, run_cli_process

pytestmark = pytest.mark.slow
PLUGINS = Path(__file__).parents[1] / "support" / "plugins"


def _install(name: str, root: Path) -> dict[str, str]:
    """pip-install the fixture package ``name`` into ``root``; an environment that sees it."""
    source, target = root / f"{name}-src", root / f"{name}-site"
    shutil.copytree(PLUGINS / name, source)  # the build leaves files next to the sources
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}


def _json(result) -> dict:
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def helium(tmp_path_factory):
    """(environment with helium-port installed, a Helium model directory with random weights)."""
    from transformers import HeliumConfig, HeliumForCausalLM

    from neuron_port.model.localdir import write_tokenizer

    root = tmp_path_factory.mktemp("helium")
    env = _install("helium_port", root)
    torch.manual_seed(0)
    config = HeliumConfig(vocab_size=512, hidden_size=96, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=6, num_key_value_heads=3, head_dim=16, initializer_range=1.0,
                          bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model_dir = root / "helium-tiny"
    HeliumForCausalLM(config).save_pretrained(model_dir)
    write_tokenizer(model_dir, config.vocab_size)
    return env, model_dir


def test_without_the_plugin_the_model_type_is_refused_naming_entry_points(helium):
    _, model_dir = helium
    res = run_cli_process("port", str(model_dir), "--max-new-tokens", "2")
    assert res.returncode != 0 and "unsupported architecture helium" in res.stderr
    assert "neuron_port.families" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("tp", [1, 2])
def test_plugin_adapter_ports_a_model_dir(helium, tp):
    """6 q / 3 kv heads: at tp 2 the ranks straddle KV groups, in gloo processes that find the plugin too."""
    env, model_dir = helium
    out = _json(run_cli_process("port", str(model_dir), "--tp", str(tp), "--ignore-eos", "--max-new-tokens", "16",
                                "--check", "--json", env=env))
    assert out["seq_match"] is True and out["new_tokens"] == 16
    assert {c["name"]: c["status"] for c in out["self_checks"]} == {"loader": "pass", "embeddings": "pass",
                                                                     "attention": "pass", "logits": "pass"}
    assert len(set(out["tokens"])) > 2  # not one repeated token


def test_plugin_artifact_records_its_adapter_and_needs_it_to_load(helium, tmp_path):
    env, model_dir = helium
    art = tmp_path / "art"
    res = run_cli_process("compile", str(model_dir), "--backend", "cpu", "--buckets", "32", "--kv-lens", "64",
                          "--out", str(art), env=env)
    assert res.returncode == 0, res.stderr
    adapter = json.loads((art / "manifest.json").read_text())["adapter"]
    assert adapter == {"name": "helium", "adapter_class": "helium_port:HeliumFamily", "distribution": "helium-port",
                       "version": "0.1.0", "entry_point": "helium"}
    out = _json(run_cli_process("generate", str(art), "--check", "--json", env=env))
    assert out["seq_match"] is True
    missing = run_cli_process("generate", str(art), "--json")  # the plugin is not on this path
    assert missing.returncode != 0 and "pip install helium-port==0.1.0" in missing.stderr
    assert "Traceback" not in missing.stderr

    srv = ServerProcess(str(art), env=env)
    try:
        body = {"model": art.name, "prompt": "hello world", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        reply = httpx.post(srv.base + "/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
    finally:
        srv.stop()


def test_describe_lint_and_plan_work_without_a_tiny_variant(helium):
    """The Helium adapter declares no tiny variant: describe and plan need none, lint says what it skipped."""
    env, model_dir = helium
    config = str(model_dir / "config.json")
    *infos, res = run_cli_commands(["describe", config], ["plan", config], ["lint", config], ["port", config, "--tiny"],
                                   env=env)
    for info in infos:
        assert info.returncode == 0 and "Traceback" not in info.stderr, info.stderr
    assert "graphs-not-traced" in infos[-1].stdout and "tiny_heads" in infos[-1].stdout
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "error: the helium adapter has no tiny variant: set its tiny_heads" in res.stderr


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    return _install("gemma_mistakes", tmp_path_factory.mktemp("mistakes"))


def test_a_plugin_replaces_a_shipped_adapter_with_a_warning(mistakes):
    res = run_cli_process("describe", "gemma-3", env=mistakes)
    assert res.returncode == 0
    assert ("gemma_mistakes:Gemma3WithoutEmbeddingScale of gemma-mistakes==0.1.0 replaces the shipped adapter "
            "neuron_port.families.gemma3:Gemma3Family") in res.stderr
    # the package's third entry point names nothing: a warning naming it, and everything else works
    assert "plugin 'missing_adapter' (gemma_mistakes:NoSuchAdapter) from gemma-mistakes" in res.stderr
    assert "could not be loaded" in res.stderr


def test_a_shipped_artifact_under_a_replacing_plugin_says_to_uninstall_it(mistakes, tmp_path):
    art = tmp_path / "art"
    res = run_cli("compile", "gemma-3", "--tiny", "--buckets", "16", "--kv-lens", "32", "--out", str(art))
    assert res.returncode == 0, res.stderr
    refused = run_cli_process("generate", str(art), "--json", env=mistakes)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "field adapter" in refused.stderr and "pip uninstall gemma-mistakes" in refused.stderr


def test_forgotten_embedding_scale_fails_the_check_naming_the_embedding(mistakes):
    res = run_cli_process("port", "gemma-3", "--tiny", "--max-new-tokens", "8", "--check", "--json", env=mistakes)
    assert res.returncode == 1
    out = _json(res)
    checks = {c["name"]: c for c in out["self_checks"]}
    assert checks["embeddings"]["status"] == "fail" and "embedding" in checks["embeddings"]["detail"]
    assert "error: self-check embeddings failed: the word embedding differs" in res.stderr


def test_forgotten_softcap_is_a_logit_mismatch_while_tokens_agree(mistakes):
    """argmax ignores the softcap, so greedy tokens agree; the step logits do not."""
    res = run_cli_process("port", "gemma-4-e2b", "--tiny", "--max-new-tokens", "8", "--check", "--json", env=mistakes)
    out = _json(res)
    assert out["seq_match"] is True
    assert res.returncode == 1
    checks = {c["name"]: c["status"] for c in out["self_checks"]}
    assert checks == {"embeddings": "pass", "attention": "pass", "logits": "fail"}
    assert out["logit_check"]["max_relative_error"] > 100 * out["logit_check"]["tolerance"]


def test_an_artifact_of_an_adapter_without_softcap_fails_generate_check(mistakes, tmp_path):
    """The artifact path sees it too: tokens agree, the artifact's step logits do not."""
    art = tmp_path / "art"
    compiled, res = run_cli_commands(
        ["compile", "gemma-4-e2b", "--tiny", "--buckets", "32", "--kv-lens", "64", "--out", str(art)],
        ["generate", str(art), "--max-new-tokens", "8", "--check", "--json"], env=mistakes)
    assert compiled.returncode == 0, compiled.stderr
    out = _json(res)
    assert res.returncode == 1 and out["seq_match"] is True
    assert {c["name"]: c["status"] for c in out["self_checks"]} == {"embeddings": "pass", "attention": "skip",
                                                                     "logits": "fail"}
