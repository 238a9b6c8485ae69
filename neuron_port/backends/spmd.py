"""One model whose even splits over tp devices are the ranks of a shard plan (for SPMD, as XLA runs it).

An SPMD program is one graph over the whole model; the partitioner gives each device an even
slice of every annotated weight and writes the collectives. :func:`spmd_model` rewrites a
model so that those even slices are exactly the library's ranks: each K/V projection holds
every rank's planned KV heads side by side (replicated heads repeated, sharded heads in place;
:func:`sharding.expanded_kv_rows`), so rows ``[r * local_kv * head_dim, ...)`` are rank r's. The
model computes the same function (a repeated KV head attends the same query heads as the one it
copies). :func:`weight_splits` names how each weight is split: q, k, v, gate and up by rows
(column-parallel), o and down by columns (row-parallel, the all-reduce), the rest replicated. An
int8 model's scales follow the same rule: split with their rows, replicated for o and down.

Plans whose ranks straddle KV groups (no uniform repeat factor) have no such layout and are refused.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import nn

from neuron_port.errors import ShardingError
from neuron_port.parallel.ranks import RankSetup, check_setup_matches
from neuron_port.parallel.shard_model import int8_scale, linear_from
from neuron_port.parallel.sharding import expanded_kv_rows

COLUMN = ("tp", None)  # rows split: each device holds its output features
ROW = (None, "tp")  # columns split: each device holds its input features; partial sums are all-reduced


def spmd_model(model: nn.Module, setup: RankSetup) -> tuple[nn.Module, dict[int, int]]:
    """A copy of ``model`` with every rank's KV heads side by side in its K/V projections.

    Returns the model and the store's KV-head count per layer (``tp x`` each rank's local count),
    whose split over the devices by head gives every rank its own store."""
    check_setup_matches(setup, model)
    layout, plan, tp = setup.layout, setup.plan, setup.tp
    family = layout.family
    if family.fused_projections:
        raise ShardingError(f"the {family.name} adapter's projections are fused: their roles cannot be even SPMD "
                            "slices (run the ranks as gloo processes on the CPU backend instead)")
    out = copy.deepcopy(model)
    kv_heads = {}
    for spec, layer in zip(layout.layers, family.decoder_layers(out), strict=True):
        heads = plan.layers[spec.index].plan
        if heads.ranks[0].groups is None:
            raise ShardingError(f"layer {spec.index}: {spec.n_q} q / {spec.n_kv} kv at tp {tp} straddles KV groups; "
                                "SPMD takes shard and replicate plans only (run the ranks as gloo processes instead)")
        attn = family.attention(layer)
        proj = family.attention_projections(attn)
        for role in ("k", "v"):
            if proj[role] is not None:
                rows = expanded_kv_rows(proj[role].weight.detach(), heads, spec.head_dim)
                vectors = [_expanded_vector(v, heads, spec.head_dim) for v in (proj[role].bias, int8_scale(proj[role]))]
                family.set_attention_projection(attn, role, linear_from(rows, *vectors))
        kv_heads[spec.index] = tp * len(heads.ranks[0].kv_heads)
        family.set_kv_groups(attn, heads.ranks[0].groups)
    return out, kv_heads


def _expanded_vector(vector: torch.Tensor | None, heads, head_dim: int) -> torch.Tensor | None:
    """A per-output-channel vector (bias, int8 scale) laid out as :func:`expanded_kv_rows` lays out the rows."""
    return expanded_kv_rows(vector.detach()[:, None], heads, head_dim)[:, 0] if vector is not None else None


def weight_splits(model: nn.Module, setup: RankSetup) -> Iterator[tuple[torch.Tensor, tuple]]:
    """(tensor, split) for every weight of :func:`spmd_model`'s model that is not replicated."""
    family = setup.layout.family
    for layer in family.decoder_layers(model):
        proj = family.attention_projections(family.attention(layer))
        mlp = family.mlp_projections(family.mlp(layer))
        for module in (proj["q"], proj["k"], proj["v"], mlp["gate"], mlp["up"]):
            if module is not None:
                yield module.weight, COLUMN
                for vector in (module.bias, int8_scale(module)):  # per output channel: split with the rows
                    if vector is not None:
                        yield vector, ("tp",)
        for module in (proj["o"], mlp["down"]):
            yield module.weight, ROW  # an int8 row-parallel projection's scales stay replicated


__all__ = ["COLUMN", "ROW", "spmd_model", "weight_splits"]
