"""GQA / tensor-parallel sharding math: which heads each rank owns and how K/V follow.

Unsharded grouped-query attention lets query head ``h`` attend KV head ``h // (n_q // n_kv)``.
Splitting query heads evenly over ``tp`` ranks (rank r owns heads ``r*q + j``, ``q = n_q // tp``)
fixes everything else: a rank must hold exactly the distinct KV heads its queries use, and
each local query head must find its KV head among them. That single rule covers every case:

* ``tp`` divides ``n_kv``: K/V are sharded without duplication; each rank keeps the global
  group size.
* ``n_kv`` divides ``tp`` (``n_kv == 1`` included): each KV head is replicated on
  ``tp // n_kv`` ranks; every local query uses the one local KV head.
* otherwise (e.g. 6 q / 3 kv at tp 2) a rank's queries straddle a group boundary, the local
  mapping is not uniform, and attention follows ``kv_for_q`` with a static gather.

The field report's rules (shard when ``n_kv % tp == 0``; else replicate all K/V and set
``groups = (n_q / tp) / n_kv``) are the first case and, only for ``n_kv == 1``, the second.

All functions here are pure; module surgery lives in :mod:`neuron_port.parallel.shard_model`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_port.errors import ShardingError
from neuron_port.model.layout import Layout


@dataclass(frozen=True)
class RankHeads:
    """What one rank holds of one attention layer.

    ``q_heads``: global query heads, in local order. ``kv_heads``: distinct global KV heads, in
    local order. ``kv_for_q[j]``: local index into ``kv_heads`` of local query ``j``.
    ``groups``: the local repeat factor when ``kv_for_q[j] == j // groups`` for all j, else None.
    """

    rank: int
    q_heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    kv_for_q: tuple[int, ...]
    groups: int | None

    def expand_matrix(self) -> torch.Tensor:
        """[local_q, local_kv] one-hot: row j selects the KV head local query j attends."""
        m = torch.zeros(len(self.q_heads), len(self.kv_heads))
        m[torch.arange(len(self.q_heads)), torch.tensor(self.kv_for_q)] = 1.0
        return m


@dataclass(frozen=True)
class AttentionPlan:
    n_q: int
    n_kv: int
    tp: int
    ranks: tuple[RankHeads, ...]

    @property
    def uniform(self) -> bool:
        return all(r.groups is not None for r in self.ranks)

    @property
    def kv_replication(self) -> int:
        """How many ranks hold each KV head (the maximum over heads)."""
        counts: dict[int, int] = {}
        for r in self.ranks:
            for h in r.kv_heads:
                counts[h] = counts.get(h, 0) + 1
        return max(counts.values())

    @property
    def strategy(self) -> str:
        if self.tp == 1:
            return "unsharded"
        if self.n_kv % self.tp == 0:
            return "shard"
        if self.tp % self.n_kv == 0:
            return "replicate"
        return "straddle"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_tp_degrees(n_q: int, n_kv: int) -> list[int]:
    """Every tp that splits the query heads evenly (the KV side always follows)."""
    return divisors(n_q) if n_kv > 0 and n_q % n_kv == 0 else []


def plan_attention(n_q: int, n_kv: int, tp: int) -> AttentionPlan:
    """The head mapping of every rank for one attention layer.

    Raises ShardingError (a ValueError) for tp < 1, n_q % n_kv != 0 or n_q % tp != 0, naming
    the numbers and the tp degrees that would work.
    """
    if n_kv < 1 or n_q < 1 or n_q % n_kv != 0:
        raise ShardingError(f"query heads ({n_q}) must be a positive multiple of KV heads ({n_kv})")
    if tp < 1 or n_q % tp != 0:
        raise ShardingError(
            f"tp degree {tp} cannot split {n_q} query heads ({n_kv} KV heads) evenly; "
            f"valid tp degrees: {valid_tp_degrees(n_q, n_kv)}"
        )
    group = n_q // n_kv
    per_rank = n_q // tp
    ranks = []
    for r in range(tp):
        q_heads = tuple(range(r * per_rank, (r + 1) * per_rank))
        needed = [h // group for h in q_heads]
        kv_heads = tuple(dict.fromkeys(needed))  # distinct, in order of first use
        kv_for_q = tuple(kv_heads.index(k) for k in needed)
        groups = None
        if per_rank % len(kv_heads) == 0:
            g = per_rank // len(kv_heads)
            if all(kv_for_q[j] == j // g for j in range(per_rank)):
                groups = g
        ranks.append(RankHeads(r, q_heads, kv_heads, kv_for_q, groups))
    return AttentionPlan(n_q, n_kv, tp, tuple(ranks))


# ---- weight splitting (pure tensor functions) ---------------------------------------------
def head_rows(weight: torch.Tensor, heads: tuple[int, ...], head_dim: int) -> torch.Tensor:
    """Rows of a projection ``[n_heads * head_dim, in]`` for ``heads``, in that order (a gather)."""
    return torch.cat([weight[h * head_dim : (h + 1) * head_dim] for h in heads], dim=0)


def head_columns(weight: torch.Tensor, heads: tuple[int, ...], head_dim: int) -> torch.Tensor:
    """Columns of an output projection ``[out, n_heads * head_dim]`` for ``heads``."""
    return torch.cat([weight[:, h * head_dim : (h + 1) * head_dim] for h in heads], dim=1)


def column_split(weight: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rows ``rank`` of ``tp`` equal parts of ``[out, in]`` (column-parallel)."""
    if weight.shape[0] % tp:
        raise ShardingError(f"cannot column-split {weight.shape[0]} outputs over tp {tp}")
    part = weight.shape[0] // tp
    return weight[rank * part : (rank + 1) * part]


def row_split(weight: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Columns ``rank`` of ``tp`` equal parts of ``[out, in]`` (row-parallel)."""
    if weight.shape[1] % tp:
        raise ShardingError(f"cannot row-split {weight.shape[1]} inputs over tp {tp}")
    part = weight.shape[1] // tp
    return weight[:, rank * part : (rank + 1) * part]


def expanded_kv_rows(weight: torch.Tensor, plan: AttentionPlan, head_dim: int) -> torch.Tensor:
    """K or V projection rows laid out so an even column split over ``tp`` gives rank r exactly
    ``plan.ranks[r].kv_heads`` — replicated heads repeated, sharded heads in place.

    weight: [n_kv * head_dim, hidden] -> [tp * local_kv * head_dim, hidden]
    """
    counts = {len(r.kv_heads) for r in plan.ranks}
    if len(counts) != 1:
        raise ShardingError(f"ranks hold different KV-head counts {sorted(counts)}; an even column split cannot express it")
    return torch.cat([head_rows(weight, r.kv_heads, head_dim) for r in plan.ranks], dim=0)


# ---- model-level plan ----------------------------------------------------------------------
@dataclass(frozen=True)
class LayerShard:
    index: int
    attention: str
    head_dim: int
    plan: AttentionPlan
    intermediate_size: int


@dataclass(frozen=True)
class ModelShardPlan:
    tp: int
    layers: tuple[LayerShard, ...]

    def local_kv_heads(self, rank: int) -> dict[int, int]:
        """Layer index -> KV heads rank ``rank`` holds (the size of its KV buffers)."""
        return {s.index: len(s.plan.ranks[rank].kv_heads) for s in self.layers}

    def kv_expand(self, rank: int) -> dict[int, torch.Tensor]:
        """Layer index -> ``[local_q, local_kv]`` one-hot gather, for the layers where rank
        ``rank``'s query heads straddle KV groups (no uniform repeat factor); empty otherwise."""
        return {s.index: s.plan.ranks[rank].expand_matrix() for s in self.layers if s.plan.ranks[rank].groups is None}

    def to_json(self) -> dict:
        layers = []
        for s in self.layers:
            layers.append(
                {
                    "index": s.index,
                    "attention": s.attention,
                    "n_q": s.plan.n_q,
                    "n_kv": s.plan.n_kv,
                    "strategy": s.plan.strategy,
                    "mlp_per_rank": s.intermediate_size // self.tp,
                    "ranks": [
                        {
                            "rank": r.rank,
                            "q_heads": list(r.q_heads),
                            "kv_heads": list(r.kv_heads),
                            "kv_for_q": list(r.kv_for_q),
                            "groups": r.groups,
                        }
                        for r in s.plan.ranks
                    ],
                }
            )
        return {"tp": self.tp, "layers": layers}


def valid_model_tp(layout: Layout) -> list[int]:
    """tp degrees that split every layer's query heads and MLP width evenly."""
    out = []
    for tp in range(1, max(s.n_q for s in layout.layers) + 1):
        if all(s.n_q % tp == 0 and s.intermediate_size % tp == 0 for s in layout.layers):
            out.append(tp)
    return out


def plan_model(layout: Layout, tp: int) -> ModelShardPlan:
    """One attention plan per layer (layers differ in KV heads and head_dim) plus the MLP split."""
    if tp < 1 or tp not in valid_model_tp(layout):
        raise ShardingError(
            f"tp degree {tp} cannot shard {layout.model_type}: every layer's query heads "
            f"({sorted({s.n_q for s in layout.layers})}) and MLP widths "
            f"({sorted({s.intermediate_size for s in layout.layers})}) must divide by it; "
            f"valid tp degrees: {valid_model_tp(layout)}"
        )
    layers = tuple(
        LayerShard(s.index, s.attention, s.head_dim, plan_attention(s.n_q, s.n_kv, tp), s.intermediate_size)
        for s in layout.layers
    )
    return ModelShardPlan(tp, layers)


def format_shard_plan(plan: ModelShardPlan) -> str:
    """Readable summary: one line per distinct layer kind."""
    lines = [f"tp {plan.tp}"]
    seen = set()
    for s in plan.layers:
        key = (s.attention, s.plan.n_q, s.plan.n_kv, s.head_dim, s.intermediate_size)
        if key in seen:
            continue
        seen.add(key)
        idx = [x.index for x in plan.layers if (x.attention, x.plan.n_q, x.plan.n_kv, x.head_dim, x.intermediate_size) == key]
        lines.append(
            f"{s.attention} layers {idx}: {s.plan.n_q} q / {s.plan.n_kv} kv heads, head_dim {s.head_dim}, "
            f"strategy {s.plan.strategy}, MLP {s.intermediate_size} -> {s.intermediate_size // plan.tp} per rank"
        )
        for r in s.plan.ranks:
            lines.append(
                f"    rank {r.rank}: q {list(r.q_heads)} kv {list(r.kv_heads)} "
                f"kv_for_q {list(r.kv_for_q)} groups {r.groups}"
            )
    return "\n".join(lines)


__all__ = [
    "RankHeads",
    "AttentionPlan",
    "plan_attention",
    "valid_tp_degrees",
    "head_rows",
    "head_columns",
    "column_split",
    "row_split",
    "expanded_kv_rows",
    "LayerShard",
    "ModelShardPlan",
    "plan_model",
    "valid_model_tp",
    "format_shard_plan",
]
