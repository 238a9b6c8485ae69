"""Module surgery: turn a Hugging Face model into one tensor-parallel rank's shard.

Attention: q by query heads (column), k and v gathered by the plan's KV heads (column),
o by query heads (row-parallel, partial sums reduced across ranks), q/k norms replicated;
KV-shared layers (no k/v) and ``k_eq_v`` layers (no v) are handled by what they lack. MLP:
gate and up by column, down by row (double-wide shared-layer MLPs split the same way).
Head counts come from the layout, never from modules being replaced (the field report's
gotcha of reading the size of a projection that was already replaced cannot happen).
Projections are reached by role through the family adapter, so the same surgery shards any
supported family.
"""

from __future__ import annotations

import copy
import torch
import torch.nn.functional as F
from torch import nn

from neuron_port.layout import Layout
from neuron_port.parallel import Reduce, identity_reduce
from neuron_port.sharding import ModelShardPlan, column_split, head_columns, head_rows, row_split


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


def linear_from(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A frozen ``nn.Linear`` holding ``weight`` [out, in] and ``bias`` [out] (copies)."""
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
    for spec, layer, lplan in zip(layout.layers, family.decoder_layers(shard), plan.layers):
        heads = lplan.plan.ranks[rank]
        d = spec.head_dim
        attn = family.attention(layer)
        proj = family.attention_projections(attn)
        q, o = proj["q"], proj["o"]
        family.set_attention_projection(attn, "q", linear_from(
            head_rows(q.weight, heads.q_heads, d),
            head_rows(q.bias[:, None], heads.q_heads, d)[:, 0] if q.bias is not None else None))
        for role in ("k", "v"):
            kv = proj[role]
            if kv is not None:
                bias = head_rows(kv.bias[:, None], heads.kv_heads, d)[:, 0] if kv.bias is not None else None
                family.set_attention_projection(attn, role, linear_from(head_rows(kv.weight, heads.kv_heads, d), bias))
        family.set_attention_projection(attn, "o", RowParallelLinear(head_columns(o.weight, heads.q_heads, d), o.bias, reduce))
        if heads.groups is not None:
            family.set_kv_groups(attn, heads.groups)
        mlp = family.mlp(layer)
        ff = family.mlp_projections(mlp)
        for role in ("gate", "up"):
            w = ff[role]
            bias = column_split(w.bias[:, None], tp, rank)[:, 0] if w.bias is not None else None
            family.set_mlp_projection(mlp, role, linear_from(column_split(w.weight, tp, rank), bias))
        down = ff["down"]
        family.set_mlp_projection(mlp, "down", RowParallelLinear(row_split(down.weight, tp, rank), down.bias, reduce))
    return shard


__all__ = ["RowParallelLinear", "linear_from", "shard_model"]
