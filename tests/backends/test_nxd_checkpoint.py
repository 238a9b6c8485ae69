"""The checkpoint an nxd artifact's ModelBuilder shards (:mod:`neuron_port.backends.nxd_checkpoint`): device
tensors only, the head under its own name, fused rows cut into their roles, K/V rows (and their biases)
expanded by the plan, int8 weights and fp32 scales in NxD's convention."""

from __future__ import annotations

import torch

from neuron_port.backends import nxd_checkpoint as ckpt
from neuron_port.model.configs import load_config
from neuron_port.model.layout import describe
from neuron_port.model.loading import build_model
from neuron_port.parallel.ranks import RankSetup


def _pieces():
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    return model, RankSetup.for_layout(describe(model), 1)


def test_the_device_checkpoint_holds_device_tensors_only():
    """No host table (the word embedding, Gemma-4's per-layer table) in what NxD loads onto every
    core; the tied head given under its own name, as NxD Inference unties it; no tensor twice
    (safetensors refuses shared memory)."""
    model, setup = _pieces()
    checkpoint = ckpt.traced_checkpoint(model, setup)
    assert not [k for k in checkpoint if "embed_tokens" in k]
    assert ckpt.host_table_keys(model) == ["model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"]
    head = checkpoint[ckpt.TRACED_PREFIX + "lm_head.weight"]
    assert torch.equal(head, model.model.embed_tokens.weight)
    pointers = [t.data_ptr() for t in checkpoint.values()]
    assert len(pointers) == len(set(pointers))


def test_fused_rows_are_cut_into_their_roles_and_kv_biases_expanded_with_their_rows():
    """Phi-3's qkv_proj / gate_up_proj reach the checkpoint as one tensor per role, named as the
    RoleConcat that computes them names its layers, equal to the fused rows; Qwen2's K/V biases are
    expanded by the plan exactly as their weight rows are (E4B-like 2 KV heads over 4 ranks)."""
    from neuron_port.parallel.sharding import expanded_kv_rows

    model = build_model(load_config("phi-3", tiny=True), seed=0)
    setup = RankSetup.for_layout(describe(model), 1)
    state = ckpt.nxd_checkpoint(model, setup)
    attn = model.model.layers[0].self_attn
    q_rows = attn.config.num_attention_heads * attn.head_dim
    kv_rows = attn.config.num_key_value_heads * attn.head_dim
    fused = attn.qkv_proj.weight
    assert "model.layers.0.self_attn.qkv_proj.weight" not in state
    assert torch.equal(state["model.layers.0.self_attn.qkv_proj.q.weight"], fused[:q_rows])
    assert torch.equal(state["model.layers.0.self_attn.qkv_proj.k.weight"], fused[q_rows:q_rows + kv_rows])
    assert torch.equal(state["model.layers.0.self_attn.qkv_proj.v.weight"], fused[q_rows + kv_rows:])
    half = model.model.layers[0].mlp.gate_up_proj.weight.shape[0] // 2
    assert torch.equal(state["model.layers.0.mlp.gate_up_proj.up.weight"], model.model.layers[0].mlp.gate_up_proj.weight[half:])

    model = build_model(load_config("qwen2", tiny=True), seed=0)
    setup = RankSetup.for_layout(describe(model), 4)
    state = ckpt.nxd_checkpoint(model, setup)
    k = model.model.layers[0].self_attn.k_proj
    heads, d = setup.plan.layers[0].plan, setup.layout.layers[0].head_dim
    assert torch.equal(state["model.layers.0.self_attn.k_proj.weight"], expanded_kv_rows(k.weight.detach(), heads, d))
    assert torch.equal(state["model.layers.0.self_attn.k_proj.bias"], expanded_kv_rows(k.bias.detach()[:, None], heads, d)[:, 0])
    assert state["model.layers.0.self_attn.k_proj.bias"].shape[0] == 2 * k.bias.shape[0]  # 2 KV heads over 4 ranks


def test_an_int8_checkpoint_keeps_int8_weights_and_fp32_scales_in_bf16():
    """NxD's convention: int8 weights, per-channel fp32 scales [out, 1] (the replicated int8 head's [vocab]),
    neither cast by the layer dtype."""
    from neuron_port.model.quant import apply_quant

    model = apply_quant(build_model(load_config("gemma-4-e2b", tiny=True), seed=0), "int8+head")
    state = ckpt.nxd_checkpoint(model, RankSetup.for_layout(describe(model), 1), torch.bfloat16)
    q = "model.layers.0.self_attn.q_proj."
    assert state[q + "weight"].dtype == torch.int8 and state[q + "scale"].dtype == torch.float32
    assert state[q + "scale"].shape == (state[q + "weight"].shape[0], 1)
    assert state["lm_head.weight"].dtype == torch.int8 and state["lm_head.scale"].shape == (model.lm_head.weight.shape[0],)
    assert state["lm_head.scale"].dtype == torch.float32
    assert state["model.layers.0.input_layernorm.weight"].dtype == torch.bfloat16
