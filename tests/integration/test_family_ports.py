"""port --check on tiny Llama and Qwen3 (tp 2), and the doctor on a Llama model directory."""


from __future__ import annotations

import json

from neuron_port import load_config
from neuron_port.model.loading import build_model
from tests.helpers import cli_json, run_cli


def test_port_llama_tiny_check_cli():
    out = cli_json(run_cli("port", "llama", "--tiny", "--check", "--json"))
    assert out["seq_match"] is True and out["new_tokens"] == 48
    assert out["tokens"] == out["reference_tokens"]


def test_port_qwen3_tiny_tp2_check_cli():
    out = cli_json(run_cli("port", "qwen3", "--tiny", "--tp", "2", "--check", "--json"))
    assert out["seq_match"] is True and out["tp"] == 2
    assert len(out["per_rank_kv_cache_bytes"]) == 2


def test_doctor_passes_a_llama_model_dir(tmp_path):
    from neuron_port.model.localdir import write_model_dir

    write_model_dir(build_model(load_config("llama", tiny=True), seed=0), tmp_path)
    result = run_cli("doctor", str(tmp_path), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["buffers"]["status"] == "pass" and "no per-layer buffers" in checks["buffers"]["detail"]
    assert checks["port"]["status"] == "pass"
