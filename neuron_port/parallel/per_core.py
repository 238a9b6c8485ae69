"""What one core holds at a tensor-parallel degree: its device parameters and its KV heads.

Device parameters per core = replicated parameters + sharded parameters / tp, from the layout and
the shard plan: q/o and MLP split by tp, k/v by the KV heads each rank holds (replicated when
n_kv < tp), norms and per-layer-input projections replicated, the LM head (vocab x hidden)
replicated. Embedding tables stay on the host unless asked otherwise. Real parameter counts, from
the Hugging Face class built on the meta device (no memory), never "effective" ones. By kind
(:class:`CoreParams`): the projections (what weight-only int8 stores at one byte, with an fp32
scale per output channel: column-parallel scales split with their rows, row-parallel ones
replicated, as neuronx-distributed's quantized parallel layers keep them) and everything else.

The planner sizes cores with these counts; the XLA backend's decode cost takes its minimum from
them, so both read the same weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from neuron_port.model.layout import Layout
from neuron_port.model.quant import HEAD_SCHEMES, check_scheme
from neuron_port.parallel.sharding import plan_model

SCALE_BYTES = 4  # an int8 projection's per-output-channel scale is fp32


@dataclass(frozen=True)
class CoreParams:
    """What one core holds, by kind (elements): ``projections`` (attention q, k, v, o and the MLP's
    weights: what ``--quant int8`` stores at one byte), ``projection_rows`` (their output channels on
    this core: one scale each when quantized; a row-parallel projection's scales are replicated),
    ``head`` (the LM head, vocab x hidden, replicated; what ``--quant-head`` stores at one byte with
    ``head_rows`` scales), ``other`` (norms, layer scalars, per-layer-input projection; tables when
    on the device) and ``tied_table``: the word table on the device, which a float head is (so it is
    counted once) and an int8 head is not (``--quant-head`` unties them)."""

    projections: int
    projection_rows: int
    head: int
    head_rows: int
    other: int
    tied_table: int = 0

    @property
    def total(self) -> int:
        return self.projections + self.head + self.other

    def weight_bytes(self, dtype_bytes: int, quant: str = "none") -> int:
        """Bytes of these weights at ``dtype_bytes`` per element; under ``quant="int8"`` the projections
        at one byte plus their fp32 scales, under ``"int8+head"`` the LM head too (and a word table on
        the device, no longer the head's, at ``dtype_bytes``)."""
        if check_scheme(quant) == "none":
            return self.total * dtype_bytes
        projections = self.projections + SCALE_BYTES * self.projection_rows
        if quant in HEAD_SCHEMES:
            head = self.head + SCALE_BYTES * self.head_rows + self.tied_table * dtype_bytes
        else:
            head = self.head * dtype_bytes
        return projections + head + self.other * dtype_bytes


_CORE_PARAMS: dict[tuple[Layout, int, bool], CoreParams] = {}


def core_params(layout: Layout, config: Any, tp: int, embeddings_on_device: bool = False) -> CoreParams:
    """The parameters one core holds at ``tp``, by kind (memoised on layout, tp, embeddings_on_device:
    the layout fixes every dimension counted)."""
    key = (layout, tp, embeddings_on_device)
    if key not in _CORE_PARAMS:
        _CORE_PARAMS[key] = _count_core_params(layout, config, tp, embeddings_on_device)
    return _CORE_PARAMS[key]


def device_params_per_core(layout: Layout, config: Any, tp: int, embeddings_on_device: bool = False) -> int:
    """Parameters one core holds: sharded parts / tp, replicated parts whole (see module doc)."""
    return core_params(layout, config, tp, embeddings_on_device).total


def _count_core_params(layout: Layout, config: Any, tp: int, embeddings_on_device: bool) -> CoreParams:
    family = layout.family
    causal_lm = family.causal_lm_class(layout.model_type)  # imported outside the device mode (torch 2.8)
    with torch.device("meta"):
        model = causal_lm(config)
    plan = plan_model(layout, tp) if tp > 1 else None
    projections = rows = other = 0
    for spec, layer in zip(layout.layers, family.decoder_layers(model), strict=True):
        layer_params = sum(p.numel() for p in layer.parameters())
        proj, ff = family.layer_projections(layer, spec.index)
        q_o = proj["q"].weight.numel() + proj["o"].weight.numel()
        kv_roles = [r for r in ("k", "v") if proj.get(r) is not None]
        kv = sum(proj[r].weight.numel() for r in kv_roles)
        mlp = sum(m.weight.numel() for m in ff.values())
        local_kv = len(plan.layers[spec.index].plan.ranks[0].kv_heads) if plan else spec.n_kv
        kv_local = kv // spec.n_kv * local_kv if kv else 0
        other += layer_params - q_o - kv - mlp
        projections += q_o // tp + kv_local + mlp // tp
        # output channels: q, gate, up split by tp; k, v by the rank's KV heads; o, down (row-parallel) whole
        rows += proj["q"].out_features // tp + proj["o"].out_features
        rows += sum(proj[r].out_features // spec.n_kv * local_kv for r in kv_roles)
        rows += sum(m.out_features // tp for role, m in ff.items() if role != "down") + ff["down"].out_features
    text = family.text_model(model)
    layer_ids = {id(p) for layer in family.decoder_layers(model) for p in layer.parameters()}
    emb_ids = {id(family.word_embedding(model).weight)}
    ple = family.per_layer_embedding(model)
    if ple is not None:
        emb_ids.add(id(ple.weight))
    for p in text.parameters():
        if id(p) not in layer_ids and id(p) not in emb_ids:
            other += p.numel()  # final norm, per-layer-input projection and its norm (replicated)
    head = layout.vocab_size * layout.hidden_size  # the LM head on the device (replicated)
    tied_table = 0
    if embeddings_on_device:
        other += layout.params.per_layer_embedding
        if family.tied_embeddings(config):
            tied_table = head  # the word table: the tied head's memory, unless --quant-head unties them
        else:
            other += head  # a word table of its own beside the head
    return CoreParams(projections, rows, head, layout.vocab_size, other, tied_table)


@functools.lru_cache(maxsize=64)
def rank0_kv_heads(layout: Layout, tp: int) -> dict[int, int] | None:
    """KV heads per layer on rank 0 (every rank holds as many) at ``tp``; None at tp 1 (all of them)."""
    return plan_model(layout, tp).local_kv_heads(0) if tp > 1 else None


__all__ = ["SCALE_BYTES", "CoreParams", "core_params", "device_params_per_core", "rank0_kv_heads"]
