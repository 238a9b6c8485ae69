"""The reuse proof: Llama and Qwen3 through the same primitives as Gemma-4, against Hugging Face's own forward
and generate."""


from __future__ import annotations

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
from neuron_port.model.configs import load_config_dict, tiny_config_dict
from neuron_port.model.loading import build_model, load_model_dir, save_model_dir

PROMPT = [2] + list(range(7, 30))  # 24 tokens


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_tp4_threads_match_hf_with_fewer_kv_heads_than_ranks(name):
    model = build_model(load_config(name, tiny=True), seed=3)
    ref = reference_generate(model, PROMPT, 32)
    got = generate(model, GenerationRequest.greedy([PROMPT], 32), shape=PortShape([32], 128), tp=4, mode="threads")
    assert got.tokens[0] == ref.tokens


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
        assert got.tokens[0] == ref.tokens, f"tp {tp}"


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
    assert got.tokens[0] == ref.tokens


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
