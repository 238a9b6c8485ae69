"""The checkpoint an nxd artifact's ModelBuilder shards: device tensors only, keyed as the traced module names them.

* :func:`nxd_checkpoint`: the full checkpoint NxD's sharding splits, from the library's shard plan
  (:mod:`neuron_port.parallel.sharding`): K/V rows (their biases and int8 scales too) expanded so an
  even column split hands every rank exactly the KV heads the plan gives it, buffers carried
  explicitly (NxD's own sharding loads parameters only), no host table (:func:`host_table_keys`),
  the LM head under its own name, a fused projection cut into its roles, int8 weights and fp32
  scales in NxD's quantized-layer convention;
* :func:`traced_checkpoint`: the same keyed as the KV-resident wrapper names its weights
  (``graph.model.<key>``), which is what ModelBuilder shards by;
* :func:`rank_checkpoints`: per-rank state dicts from the library's own ranks.

Pure tensor work: nothing here imports the Neuron SDK.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from neuron_port.errors import ShardingError
from neuron_port.families import family_of
from neuron_port.families.parts import RoleView
from neuron_port.model.buffers import persistent_buffers
from neuron_port.model.loading import checkpoint_state
from neuron_port.model.quant import fp32_keys
from neuron_port.parallel.ranks import Rank, RankSetup, run_ranks
from neuron_port.parallel.sharding import expanded_kv_rows


def host_table_keys(model: nn.Module) -> list[str]:
    """Checkpoint keys of the tables the host gathers from (the word embedding, Gemma-4's per-layer
    embedding): the graphs take their rows as inputs, so no device shard holds them."""
    family = family_of(model)
    return [k for k in (family.word_embedding_key(), family.per_layer_embedding_key()) if k is not None]


def device_head(model: nn.Module) -> nn.Module:
    """The LM head module the device computes with (tied or not); refused where it has no weight."""
    head = family_of(model).head_module(model)
    if getattr(head, "weight", None) is None:
        raise ShardingError(f"{type(model).__name__} has no head module with a weight; the nxd backend gives the "
                            "device its own head (untied from the host's word table) in that module")
    return head


def nxd_checkpoint(model: nn.Module, setup: RankSetup, layer_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full checkpoint NxD's sharding splits: device tensors only (no host table), the LM head
    under its own name even when the model ties it to the word table, K/V rows expanded by the
    setup's plan, buffers included, optionally cast to the layer dtype (bf16 halves the neff).
    An int8 model's projections follow NxD's quantized-layer convention: the int8 ``weight`` and an
    fp32 ``scale`` of shape [out, 1] (K/V scales expanded with their rows), never cast; an int8 head keeps
    its library shape (scale [vocab]: it stays a replicated ``Int8Linear``). K/V biases are expanded with
    their rows. A fused projection's rows (a :class:`~neuron_port.families.parts.RoleView` per role) are
    written under ``<fused module>.<role>.weight`` / ``.bias``, the names of the
    :class:`~neuron_port.families.parts.RoleConcat` that computes it, and the fused tensor is left out."""
    layout, plan = setup.layout, setup.plan
    family = layout.family
    state = checkpoint_state(model, clone=False)
    for name, buf in persistent_buffers(model).items():
        state[name] = buf.detach()  # NxD loads parameters only: carry the buffers explicitly
    state[family.lm_head_key()] = device_head(model).weight.detach()
    tables = tuple(key.rpartition(".")[0] + "." for key in host_table_keys(model))
    # the host tables (weights and any buffer of theirs) are left out before anything is copied
    state = {k: v.clone() for k, v in state.items() if not k.startswith(tables)}
    names = {id(m): n for n, m in model.named_modules()}
    for spec, layer in zip(layout.layers, family.decoder_layers(model), strict=True):
        heads = plan.layers[spec.index].plan
        for role, proj in _roles(family, layer, spec.index):
            if isinstance(proj, RoleView):  # cut out of its fused module: the role's layer holds it under its role
                fused = _fused_name(names[id(layer)], layer, proj)
                state.pop(f"{fused}.weight", None)  # once per fused module: its first role takes it
                state.pop(f"{fused}.bias", None)
                prefix = f"{fused}.{role}."
            elif role in ("k", "v"):
                prefix = names[id(proj)] + "."
            else:
                continue
            for leaf in ("weight", "bias", "scale"):
                tensor = getattr(proj, leaf, None)
                if tensor is None:
                    continue
                tensor = tensor.detach()
                if role in ("k", "v"):  # every output row (and its bias and scale) expanded by the plan
                    rows = tensor if tensor.dim() == 2 else tensor[:, None]
                    expanded = expanded_kv_rows(rows, heads, spec.head_dim)
                    tensor = expanded if tensor.dim() == 2 else expanded[:, 0]
                state[prefix + leaf] = tensor.clone()
    scales = fp32_keys(model)
    head_scale = family.lm_head_key().removesuffix("weight") + "scale"
    for key in scales - {head_scale}:  # NxD's per-channel scale is [out, 1] (its scale_dequantize broadcasts it)
        state[key] = state[key].reshape(-1, 1).float()
    if layer_dtype is not None:
        state = {k: (v.to(layer_dtype) if v.is_floating_point() and k not in scales else v) for k, v in state.items()}
    return state


def _roles(family, layer: nn.Module, index: int) -> list[tuple[str, Any]]:
    """(role, projection) of every attention and MLP role layer ``index`` has (a module or a RoleView)."""
    attn, mlp = family.layer_projections(layer, index)
    return [(role, proj) for role, proj in {**attn, **mlp}.items() if proj is not None]


def _fused_name(layer_name: str, layer: nn.Module, view: RoleView) -> str:
    """The checkpoint name of the fused module ``view``'s rows are cut from: the layer's module whose
    weight holds them (found by memory, so no family names the module twice)."""
    start = view.weight.data_ptr()
    for name, module in layer.named_modules():
        weight = getattr(module, "weight", None)
        if name and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            end = weight.data_ptr() + weight.numel() * weight.element_size()
            if weight.data_ptr() <= start < end:
                return f"{layer_name}.{name}"
    raise ShardingError(f"{layer_name}: no module of the layer holds the fused rows a RoleView names")


def _rank_state(layer_dtype: torch.dtype | None, rank: Rank) -> dict[str, torch.Tensor]:
    state = checkpoint_state(rank.model, clone=False)
    for name, buf in persistent_buffers(rank.model).items():
        state[name] = buf.detach().clone()
    if layer_dtype is not None:  # int8 scales stay fp32
        scales = fp32_keys(rank.model)
        state = {k: (v.to(layer_dtype) if v.is_floating_point() and k not in scales else v) for k, v in state.items()}
    return state


def rank_checkpoints(model: nn.Module, setup: RankSetup, layer_dtype: torch.dtype | None = None) -> list[dict[str, torch.Tensor]]:
    """Per-rank state dicts from the setup's shard plan, buffers included, optionally cast (each
    rank's shard made by :func:`neuron_port.parallel.ranks.run_ranks`, as threads)."""
    return run_ranks(functools.partial(_rank_state, layer_dtype), setup, model, mode="threads")


TRACED_PREFIX = "graph.model."
"""Where a :class:`KVResident` wrapper names the model's weights: ``graph`` (the static graph)
then ``model`` (the CausalLM it runs)."""


def traced_checkpoint(model: nn.Module, setup: RankSetup, layer_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """:func:`nxd_checkpoint` keyed as the traced wrapper names its weights (``graph.model.<key>``):
    ModelBuilder shards a checkpoint by the traced module's parameter names and silently keeps
    none of a checkpoint keyed by the checkpoint's own names. The traced module (built on
    :func:`device_copy`) has no host table and its own head, so every name here is one of its
    tensors and no tensor goes by two names."""
    return {TRACED_PREFIX + k: v for k, v in nxd_checkpoint(model, setup, layer_dtype).items()}


__all__ = ["host_table_keys", "device_head", "nxd_checkpoint", "traced_checkpoint", "TRACED_PREFIX", "rank_checkpoints"]
