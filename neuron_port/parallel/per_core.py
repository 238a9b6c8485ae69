"""What one core holds at a tensor-parallel degree: its device parameters and its KV heads.

Device parameters per core = replicated parameters + sharded parameters / tp, from the layout and
the shard plan: q/o and MLP split by tp, k/v by the KV heads each rank holds (replicated when
n_kv < tp), norms and per-layer-input projections replicated, the tied LM head (vocab x hidden)
replicated. Embedding tables stay on the host unless asked otherwise. Real parameter counts, from
the Hugging Face class built on the meta device (no memory), never "effective" ones.

The planner sizes cores with these counts; the XLA backend's decode cost takes its minimum from
them, so both read the same weights.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from neuron_port.model.layout import Layout
from neuron_port.parallel.sharding import plan_model

_DEVICE_PARAMS: dict[tuple[Layout, int, bool], int] = {}


def device_params_per_core(layout: Layout, config: Any, tp: int, embeddings_on_device: bool = False) -> int:
    """Parameters one core holds: sharded parts / tp, replicated parts whole (see module doc).

    Memoised on (layout, tp, embeddings_on_device): the layout fixes every dimension counted.
    """
    key = (layout, tp, embeddings_on_device)
    if key not in _DEVICE_PARAMS:
        _DEVICE_PARAMS[key] = _count_device_params(layout, config, tp, embeddings_on_device)
    return _DEVICE_PARAMS[key]


def _count_device_params(layout: Layout, config: Any, tp: int, embeddings_on_device: bool) -> int:
    family = layout.family
    causal_lm = family.causal_lm_class(layout.model_type)  # imported outside the device mode (torch 2.8)
    with torch.device("meta"):
        model = causal_lm(config)
    plan = plan_model(layout, tp) if tp > 1 else None
    total = 0
    for spec, layer in zip(layout.layers, family.decoder_layers(model), strict=True):
        layer_params = sum(p.numel() for p in layer.parameters())
        proj, ff = family.layer_projections(layer, spec.index)
        q_o = proj["q"].weight.numel() + proj["o"].weight.numel()
        kv = sum(proj[r].weight.numel() for r in ("k", "v") if proj.get(r) is not None)
        mlp = sum(m.weight.numel() for m in ff.values())
        rest = layer_params - q_o - kv - mlp
        local_kv = len(plan.layers[spec.index].plan.ranks[0].kv_heads) if plan else spec.n_kv
        kv_local = kv // spec.n_kv * local_kv if kv else 0
        total += rest + q_o // tp + kv_local + mlp // tp
    text = family.text_model(model)
    layer_ids = {id(p) for layer in family.decoder_layers(model) for p in layer.parameters()}
    emb_ids = {id(family.word_embedding(model).weight)}
    ple = family.per_layer_embedding(model)
    if ple is not None:
        emb_ids.add(id(ple.weight))
    for p in text.parameters():
        if id(p) not in layer_ids and id(p) not in emb_ids:
            total += p.numel()  # final norm, per-layer-input projection and its norm (replicated)
    total += layout.vocab_size * layout.hidden_size  # tied LM head on the device
    if embeddings_on_device:
        total += layout.params.per_layer_embedding  # word table is the tied head, already counted
    return total


@functools.lru_cache(maxsize=64)
def rank0_kv_heads(layout: Layout, tp: int) -> dict[int, int] | None:
    """KV heads per layer on rank 0 (every rank holds as many) at ``tp``; None at tp 1 (all of them)."""
    return plan_model(layout, tp).local_kv_heads(0) if tp > 1 else None


__all__ = ["device_params_per_core", "rank0_kv_heads"]
