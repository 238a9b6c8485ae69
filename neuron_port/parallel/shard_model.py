"""Module surgery: turn a Hugging Face model into one tensor-parallel rank's shard.

Attention: q by query heads (column), k and v gathered by the plan's KV heads (column),
o by query heads (row-parallel, partial sums reduced across ranks), q/k norms replicated;
KV-shared layers (no k/v) and ``k_eq_v`` layers (no v) are handled by what they lack. MLP:
gate and up by column, down by row (double-wide shared-layer MLPs split the same way).
Head counts come from the layout, never from modules being replaced (the field report's
gotcha of reading the size of a projection that was already replaced cannot happen).
Projections are reached by role through the family adapter, so the same surgery shards any
supported family.

An int8 model (:mod:`neuron_port.model.quant`) shards by the same rule: a column-parallel
projection's fp32 scales (one per output channel) go with their rows, a row-parallel one's are
replicated (each rank's partial sum is scaled before the reduce), as neuronx-distributed's
quantized parallel layers keep them.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from neuron_port.model.layout import Layout
from neuron_port.model.quant import Int8Linear
from neuron_port.parallel.launch import Reduce, identity_reduce
from neuron_port.parallel.sharding import ModelShardPlan, column_split, head_columns, head_rows, row_split


class RowParallelLinear(nn.Module):
    """``y = reduce(x @ W_r^T) + b``: a row-parallel shard whose partial output is summed over ranks.

    x: [..., in / tp] -> y: [..., out]
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, reduce: Reduce):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        self.reduce = reduce

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.reduce(F.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y


class Int8RowParallelLinear(Int8Linear):
    """The int8 row-parallel shard: ``y = reduce((x @ q_r.to(x.dtype)^T) * scale) + b``, with the rank's
    int8 columns ``q_r [out, in / tp]`` and the whole row's fp32 ``scale [out]`` (replicated).

    x: [..., in / tp] -> y: [..., out]
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, reduce: Reduce):
        super().__init__(q, scale)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.reduce(self.scaled_matmul(x))
        return y + self.bias.to(y.dtype) if self.bias is not None else y


def row_parallel(weight: torch.Tensor, bias: torch.Tensor | None, reduce: Reduce,
                 scale: torch.Tensor | None = None) -> nn.Module:
    """A :class:`RowParallelLinear` of ``weight``'s columns, or with ``scale`` an :class:`Int8RowParallelLinear`."""
    if scale is None:
        return RowParallelLinear(weight, bias, reduce)
    return Int8RowParallelLinear(weight.detach().clone(), scale.detach().clone(), bias, reduce)


def linear_from(weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None = None) -> nn.Module:
    """A frozen ``nn.Linear`` holding ``weight`` [out, in] and ``bias`` [out] (copies); with ``scale``
    [out], an :class:`~neuron_port.model.quant.Int8Linear` of the int8 ``weight``."""
    if scale is not None:
        return Int8Linear(weight.detach().clone(), scale.detach().clone(), bias)
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer.requires_grad_(False)


def shard_model(
    model: nn.Module,
    layout: Layout,
    plan: ModelShardPlan,
    rank: int,
    reduce: Reduce = identity_reduce,
    inplace: bool = False,
) -> nn.Module:
    """Rank ``rank``'s shard of ``model`` under ``plan`` (a copy unless ``inplace``).

    Straddling layers (``groups`` None in the plan) need the rank's KV-head gather at attention
    time: the graphs take it from ``plan.kv_expand(rank)``, nothing is planted on the modules.
    """
    tp = plan.tp
    shard = model if inplace else copy.deepcopy(model)
    family = layout.family
    for spec, layer, lplan in zip(layout.layers, family.decoder_layers(shard), plan.layers, strict=True):
        heads = lplan.plan.ranks[rank]
        proj, ff = family.layer_projections(layer, spec.index)
        attn = family.attention(layer)
        family.set_attention_projections(attn, _attention_shard(proj, heads, spec.head_dim, reduce))
        if heads.groups is not None:
            family.set_kv_groups(attn, heads.groups)
        mlp = family.mlp(layer)
        local = {role: linear_from(column_split(ff[role].weight, tp, rank), _column_vector(ff[role].bias, tp, rank),
                                   _column_vector(int8_scale(ff[role]), tp, rank))
                 for role in ("gate", "up")}
        local["down"] = row_parallel(row_split(ff["down"].weight, tp, rank), ff["down"].bias, reduce, int8_scale(ff["down"]))
        family.set_mlp_projections(mlp, local)
    return shard


def int8_scale(module: nn.Module) -> torch.Tensor | None:
    """An int8 projection's per-output-channel scales [out]; None for a float one."""
    return module.scale if isinstance(module, Int8Linear) else None


def _column_vector(vector: torch.Tensor | None, tp: int, rank: int) -> torch.Tensor | None:
    """The rank's part of a per-output-channel vector (bias, scale) of a column-parallel projection."""
    return column_split(vector[:, None], tp, rank)[:, 0] if vector is not None else None


def _head_vector(vector: torch.Tensor | None, heads: tuple[int, ...], head_dim: int) -> torch.Tensor | None:
    """A per-output-channel vector (bias, scale) of ``heads``' rows."""
    return head_rows(vector[:, None], heads, head_dim)[:, 0] if vector is not None else None


def _attention_shard(proj: dict, heads, head_dim: int, reduce: Reduce) -> dict[str, nn.Module]:
    """A rank's q (its query heads), k and v (its KV heads, where the layer has them) and o
    (the columns of its query heads, row-parallel)."""
    def rows(role: str, chosen: tuple[int, ...]) -> nn.Module:
        module = proj[role]
        return linear_from(head_rows(module.weight, chosen, head_dim), _head_vector(module.bias, chosen, head_dim),
                           _head_vector(int8_scale(module), chosen, head_dim))

    out: dict[str, nn.Module] = {"q": rows("q", heads.q_heads)}
    for role in ("k", "v"):
        if proj.get(role) is not None:
            out[role] = rows(role, heads.kv_heads)
    out["o"] = row_parallel(head_columns(proj["o"].weight, heads.q_heads, head_dim), proj["o"].bias, reduce,
                            int8_scale(proj["o"]))
    return out


__all__ = ["RowParallelLinear", "Int8RowParallelLinear", "row_parallel", "linear_from", "int8_scale", "shard_model"]
