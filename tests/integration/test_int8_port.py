"""``--quant int8`` end to end: the port with int8 projections computes what the same quantized model
computes in Hugging Face's forward (tokens equal, logits within the float32 bound), at tp 1 and over
gloo ranks (which reload the int8 model from a directory), in a compiled artifact reloaded by a fresh
process, and on a real checkpoint, where the drift from the float32 model is judged against the measured
bound, and a planted error in the scales fails that check."""

import pytest
import torch

import neuron_port.model.quant as quant
from tests.helpers import cli_json, run_cli, run_cli_process


def _checks(out: dict) -> dict[str, dict]:
    return {check["name"]: check for check in out["self_checks"]}


@pytest.mark.parametrize("tp", [1, 2])
def test_port_int8_matches_the_quantized_model(tp):
    out = cli_json(run_cli("port", "gemma-4-e2b", "--tiny", "--tp", str(tp), "--quant", "int8", "--check",
                           "--max-new-tokens", "24", "--json"))
    assert out["quant"] == "int8" and out["seq_match"] and out["self_checks_passed"] and out["tokens_must_match"]
    assert out["logit_check"]["max_relative_error"] < 1e-3  # the port against HF's forward of the same int8 model
    checks = _checks(out)
    assert checks["logits"]["status"] == "pass" and checks["quant-drift"]["status"] == "skip"  # random weights
    assert 0 < out["quant_check"]["max_relative_error"]  # the drift from the float32 model is reported


def test_an_int8_artifact_reloads_in_a_fresh_process(tmp_path):
    """With --quant-head, the superset: int8 projections and an int8 LM head untied from the host's table."""
    art = tmp_path / "art"
    summary = cli_json(run_cli("compile", "gemma-4-e2b", "--tiny", "--quant", "int8", "--quant-head", "--buckets", "32",
                               "--kv-lens", "64", "--out", str(art), "--json"))
    assert summary["quant"] == "int8+head"
    # (The CPU artifact's TorchScript freeze folds each int8 weight's cast into a float32 constant: it is no
    # smaller than a float one. The device path keeps int8: see tests/xla/test_xla_int8.py.)
    out = cli_json(run_cli_process("generate", str(art), "--max-new-tokens", "12", "--check", "--json"))
    assert out["seq_match"] and out["self_checks_passed"] and out["logit_check"]["max_relative_error"] < 1e-3
    assert _checks(out)["embeddings"]["status"] == "pass"  # the host's float table, not the int8 head
    refused = run_cli("generate", str(art), "--quant", "int8", "--max-new-tokens", "2")
    assert refused.returncode != 0 and "compiled with --quant int8 --quant-head" in refused.stderr


def test_a_real_checkpoint_in_int8_passes_within_the_measured_bound_and_a_wrong_scale_fails(smollm2_dir, monkeypatch):
    args = ("port", str(smollm2_dir), "--quant", "int8", "--check", "--prompt", "The capital of France is",
            "--max-new-tokens", "12", "--json")
    out = cli_json(run_cli(*args))
    checks = _checks(out)
    assert out["self_checks_passed"] and checks["loader"]["status"] == "pass" and checks["quant-drift"]["status"] == "pass"
    assert out["quant_check"]["max_relative_error"] <= out["quant_check"]["tolerance"]
    true_rows = quant.quantize_rows

    def wrong_scale(weight: torch.Tensor):  # every dequantized weight 30 % too large, in port and oracle alike
        q, scale = true_rows(weight)
        return q, scale * 1.3

    monkeypatch.setattr(quant, "quantize_rows", wrong_scale)
    broken = run_cli(*args)
    assert broken.returncode == 1 and "self-check quant-drift failed" in broken.stderr


def test_port_with_an_int8_head_matches_the_quantized_model_and_a_float_head_fails(monkeypatch):
    """--quant-head: the port's logits come from the int8 head (HF's forward of the same model is the oracle);
    a port that kept reading the float word table as its head fails the logits check."""
    import neuron_port.graph.graphs as graphs

    args = ("port", "gemma-4-e2b", "--tiny", "--quant", "int8", "--quant-head", "--check", "--max-new-tokens", "16",
            "--json")
    out = cli_json(run_cli(*args))
    assert out["quant"] == "int8+head" and out["seq_match"] and out["self_checks_passed"]
    assert out["logit_check"]["max_relative_error"] < 1e-4
    monkeypatch.setattr(graphs, "head_logits", lambda family, model, hidden: hidden @ family.word_embedding(model).weight.t())
    broken = run_cli(*args)
    assert broken.returncode == 1 and "self-check logits failed" in broken.stderr
    refused = run_cli("port", "gemma-4-e2b", "--tiny", "--quant-head")
    assert refused.returncode == 2 and "--quant-head" in refused.stderr and "needs --quant int8" in refused.stderr


def test_a_real_checkpoint_with_an_int8_head_passes_within_its_measured_bound(smollm2_dir):
    out = cli_json(run_cli("port", str(smollm2_dir), "--quant", "int8", "--quant-head", "--check", "--prompt",
                           "The capital of France is", "--max-new-tokens", "12", "--json"))
    checks = _checks(out)
    assert out["quant"] == "int8+head" and out["self_checks_passed"] and checks["quant-drift"]["status"] == "pass"
    assert checks["embeddings"]["status"] == "pass" and checks["loader"]["status"] == "pass"
    assert 0 < out["quant_check"]["max_relative_error"] <= out["quant_check"]["tolerance"]
