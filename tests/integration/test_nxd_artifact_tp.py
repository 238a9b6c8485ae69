"""nxd artifacts beyond one core, end to end on the stand-in Neuron SDK (``tests/support/sdk_standin``; a contract
test, not a hardware result): biased projections (Qwen2) and fused ones (Phi-3) at tp 1 and 2, compiled in one
process and checked by ``generate DIR --check`` in another against Hugging Face; the plan a single SPMD graph
cannot carry (queries straddling KV groups) refused; and cores handed each other's part of a layer failing the
check. The int8 artifacts at tp 1, 2 and 4 are ``test_nxd_artifact_features.py``'s."""

from __future__ import annotations

import json
from pathlib import Path

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


def phi3_4q2kv(directory: Path) -> str:
    """A small Phi-3 config.json whose 4 q / 2 kv heads split at tp 2 (the shipped tiny's 6 / 3 straddle; Phi-3-mini
    itself has 32 / 32)."""
    from neuron_port.model.configs import config_to_dict, load_config

    raw = config_to_dict(load_config("phi-3", tiny=True))
    raw.update(num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    path = directory / "phi3-4q2kv.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("name,tp", [("qwen2", 1), ("qwen2", 2), ("phi-3", 1), ("phi-3-4q2kv", 2)])
def test_biased_and_fused_projections_generate_hugging_faces_tokens_on_nxd(name, tp, tmp_path):
    model = phi3_4q2kv(tmp_path) if name == "phi-3-4q2kv" else name
    summary = compile_on_standin(tmp_path / "A", model, "nxd", "--tp", str(tp))
    assert len(summary["shard_bytes_per_core"]) == tp and abs(summary["shard_to_plan"] - 1) < 0.02, summary
    keys = shard_dtypes(tmp_path / "A", tp - 1)
    if name == "qwen2":
        assert "graph.model.model.layers.0.self_attn.k_proj.bias" in keys
    else:  # the fused rows cut into their roles, each its own layer
        assert "graph.model.model.layers.0.self_attn.qkv_proj.k.weight" in keys
        assert not [k for k in keys if k.endswith("qkv_proj.weight")]
    out = generate_on_standin(tmp_path / "A")
    assert out["tp"] == tp and out["seq_match"] is True and out["self_checks_passed"] is True
    assert out["tokens"] == out["reference_tokens"]
    assert out["logit_check"]["max_relative_error"] < TIGHT, out["logit_check"]


def test_the_phi3_tiny_that_straddles_kv_groups_is_refused_at_tp_2(tmp_path):
    """The shipped tiny Phi-3 (6 q / 3 kv) at tp 2: each core's queries straddle a KV group, which one SPMD graph
    cannot carry as constants; refused before tracing, with the tp that would work, nothing left behind."""
    res = run_cli_process("compile", "phi-3", "--tiny", "--backend", "nxd", "--tp", "2", *SHAPE, "--out",
                          str(tmp_path / "A"), env=standin_env())
    assert res.returncode != 0 and "straddles KV groups" in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "A").exists()


def test_the_check_fails_when_the_cores_hold_each_others_part_of_one_layer(tmp_path):
    """At tp 2 every core runs the same graph on its own shard: hand core 0 core 1's part of one row-parallel
    projection (and core 1 core 0's) and the all-reduced sum is wrong, so the check fails; the shapes and
    dtypes are all right, so only running each core's own part could have passed."""
    plant = ("w = state['model.layers.0.self_attn.o_proj.weight']; h = w.shape[1] // 2; "
             "state['model.layers.0.self_attn.o_proj.weight'] = torch.cat([w[:, h:], w[:, :h]], 1)")
    res = compile_with_planted_checkpoint(plant, "gemma-4-e4b", "--tiny", "--backend", "nxd", "--tp", "2", *SHAPE,
                                          "--out", str(tmp_path / "A"))
    assert res.returncode == 0, res.stderr[-2000:]
    out = generate_on_standin(tmp_path / "A")
    assert out["self_checks_passed"] is False
    assert out["logit_check"]["max_relative_error"] > out["logit_check"]["tolerance"]


