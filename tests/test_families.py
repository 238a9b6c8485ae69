"""The reuse proof: Llama and Qwen3 go through the same primitives as Gemma-4, untouched.

Every check compares against Hugging Face's own forward / ``generate`` on CPU. The must-show
CLI lines (``port llama --tiny --check`` and ``port qwen3 --tiny --tp 2 --check``) run as
fresh processes, the way a user types them.
"""

from __future__ import annotations

import json

import pytest
import torch

from neuron_port import describe, load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.families import family_for
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.graphs import DecodeGraph
from neuron_port.graph.kv import kv_store_spec
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config_dict, shipped_names, tiny_config_dict
from neuron_port.model.loading import build_model, load_model_dir, save_model_dir
from tests.helpers import run_cli

PROMPT = [2] + list(range(7, 30))  # 24 tokens


def _json(result) -> dict:
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_the_cli_lists_both_families():
    assert {"llama", "qwen3"} <= set(shipped_names())


@pytest.mark.parametrize("name,total,kv_heads", [("llama", 1.236e9, 8), ("qwen3", 0.596e9, 8)])
def test_describe_real_configs(name, total, kv_heads):
    """Parameter totals agree with the published sizes (Llama-3.2-1B 1.24 B, Qwen3-0.6B 0.6 B)."""
    layout = _json(run_cli("describe", name, "--json"))
    assert abs(layout["params"]["total"] - total) / total < 0.01
    assert layout["kv_owners"] == list(range(layout["num_layers"]))
    assert {s["attention"] for s in layout["layers"]} == {"full"} and layout["sliding_window"] is None
    assert {s["n_kv"] for s in layout["layers"]} == {kv_heads}
    assert layout["params"]["per_layer_embedding"] == 0


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_shard_plans_at_tp2_and_tp4(name):
    """tp 2 splits the tiny KV heads; tp 4 has more ranks than KV heads and replicates them."""
    two = _json(run_cli("shard-plan", name, "--tiny", "--tp", "2", "--json"))
    four = _json(run_cli("shard-plan", name, "--tiny", "--tp", "4", "--json"))
    layer2, layer4 = two["layers"][0], four["layers"][0]
    assert layer2["n_kv"] == 2 and layer2["strategy"] == "shard"
    assert [r["kv_heads"] for r in layer2["ranks"]] == [[0], [1]]
    assert layer4["strategy"] == "replicate"
    assert [r["kv_heads"] for r in layer4["ranks"]] == [[0], [0], [1], [1]]
    q_per_rank = layer4["n_q"] // 4
    assert all(len(r["q_heads"]) == q_per_rank for r in layer4["ranks"])
    bad = run_cli("shard-plan", name, "--tiny", "--tp", "3")
    assert bad.returncode == 2 and "valid tp degrees" in bad.stderr


def test_port_llama_tiny_check_cli():
    out = _json(run_cli("port", "llama", "--tiny", "--check", "--json"))
    assert out["seq_match"] is True and out["new_tokens"] == 48
    assert out["tokens"] == out["reference_tokens"]


def test_port_qwen3_tiny_tp2_check_cli():
    out = _json(run_cli("port", "qwen3", "--tiny", "--tp", "2", "--check", "--json"))
    assert out["seq_match"] is True and out["tp"] == 2
    assert len(out["per_rank_kv_cache_bytes"]) == 2


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_tp4_threads_match_hf_with_fewer_kv_heads_than_ranks(name):
    model = build_model(load_config(name, tiny=True), seed=3)
    ref = reference_generate(model, PROMPT, 32)
    got = generate(model, GenerationRequest.greedy([PROMPT], 32), shape=PortShape([32], 128), tp=4, mode="threads")
    assert got.tokens[0] == ref["tokens"]


def test_qwen3_sliding_layers_use_rings_and_match_hf():
    """Qwen3 can declare sliding layers; the ring-buffer store is family-agnostic."""
    text = tiny_config_dict(load_config_dict("qwen3"))
    text.update(use_sliding_window=True, sliding_window=8, max_window_layers=2)
    config = family_for("qwen3").make_config(text)
    model = build_model(config, seed=1)
    layout = describe(model)
    assert [s.attention for s in layout.layers] == ["full", "full", "sliding", "sliding"]
    spec = kv_store_spec(layout, 128)
    assert [s.slots for s in spec.slots] == [128, 128, 8, 8]
    ref = reference_generate(model, PROMPT, 40)
    for tp in (1, 2):
        got = generate(model, GenerationRequest.greedy([PROMPT], 40), shape=PortShape([32], 128), tp=tp, mode="threads")
        assert got.tokens[0] == ref["tokens"], f"tp {tp}"


def test_untied_llama_round_trips_through_a_model_dir(tmp_path):
    """An untied LM head is saved, reloaded and used by the graphs (not the word embedding)."""
    text = tiny_config_dict(load_config_dict("llama"))
    text["tie_word_embeddings"] = False
    model = build_model(family_for("llama").make_config(text), seed=2)
    family = family_for("llama")
    assert not torch.equal(family.lm_head_weight(model), family.word_embedding(model).weight)
    save_model_dir(model, tmp_path)
    loaded = load_model_dir(tmp_path)
    ids = torch.tensor([PROMPT])
    assert torch.equal(model(ids).logits, loaded(ids).logits)
    ref = reference_generate(loaded, PROMPT, 24)
    got = generate(loaded, GenerationRequest.greedy([PROMPT], 24), shape=PortShape([32], 64), tp=2)  # gloo ranks load the dir
    assert got.tokens[0] == ref["tokens"]


def test_a_mask_in_the_wrong_form_fails_loudly(monkeypatch):
    """A family adapter that hands Llama the mask mapping would attend everything; the graph refuses."""
    model = build_model(load_config("llama", tiny=True), seed=0)
    layout = describe(model)
    family = family_for("llama")
    monkeypatch.setattr(type(family), "attention_mask_argument",
                        lambda self, masks: {"full_attention": masks["full"], "sliding_attention": masks["sliding"]})
    port = Port.over_model(model, PortShape([8], 32), layout)
    inputs = [t for part in port.inputs.example_decode(32) for t in part]  # step inputs, then the store
    with pytest.raises(ValueError, match="got no mask"):
        DecodeGraph(model, kv_store_spec(layout, 32))(*inputs)


def test_doctor_passes_a_llama_model_dir(tmp_path):
    from neuron_port.model.localdir import write_model_dir

    write_model_dir(build_model(load_config("llama", tiny=True), seed=0), tmp_path)
    result = run_cli("doctor", str(tmp_path), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["buffers"]["status"] == "pass" and "no per-layer buffers" in checks["buffers"]["detail"]
    assert checks["port"]["status"] == "pass"
