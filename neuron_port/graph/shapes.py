"""The static shapes of a port: prompt buckets, KV lengths, and the KV store at each length.

Every graph a port compiles has fixed shapes. :class:`PortShape` is what a caller asks for
(prompt buckets, KV lengths, rings for sliding layers or not); :class:`StoreShapes` is what
one rank gets from it: the KV store spec at every KV length (with the rank's local KV-head
counts), which KV length each bucket's prefill writes into, and the ring size of each store.

Bucket rules: a prompt goes to the first prompt bucket that holds it; the bucket's prefill
writes into the smallest KV length that holds the bucket; decoding moves to the next KV
length when a row outgrows the current one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neuron_port.errors import BucketError
from neuron_port.graph.kv import KVStoreSpec, kv_store_spec
from neuron_port.model.layout import Layout

if TYPE_CHECKING:
    from neuron_port.parallel.ranks import RankSetup


def select_bucket(length: int, buckets: Sequence[int]) -> int:
    """First bucket that holds ``length`` tokens; a clear error when none does."""
    for bucket in sorted(buckets):
        if length <= bucket:
            return bucket
    raise BucketError(
        f"prompt of {length} tokens is longer than the largest prompt bucket ({max(buckets)}); "
        f"use a shorter prompt or build the port with a larger bucket"
    )


def _sizes(values: int | Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted({int(values)} if isinstance(values, int) else {int(v) for v in values}))


def occupancy_rows(batch: int) -> tuple[int, ...]:
    """Row counts of the extra decode graphs a port compiled for ``batch`` rows gets, so a step runs
    the smallest graph holding its occupied rows instead of every row: the powers of two below
    ``batch`` (vLLM and NxD Inference pick decode graphs by batch size the same way)."""
    if batch < 1:
        raise BucketError(f"a batch has at least 1 row, found {batch}")
    return tuple(1 << i for i in range(batch.bit_length()) if 1 << i < batch)


def decode_rows_for(batch: int, asked: Sequence[int] | None = None) -> tuple[int, ...]:
    """The row counts below ``batch`` a compiled port gets decode graphs for, ascending: ``asked`` kept where
    it lies in ``1..batch - 1``, or :func:`occupancy_rows` when nothing is asked (``()`` asks for none)."""
    if asked is None:
        return occupancy_rows(batch)
    return tuple(sorted({int(r) for r in asked if 0 < int(r) < batch}))


def rows_for(needed: int, batch: int | None, rows: Sequence[int]) -> int:
    """The fewest rows a decode step can run on when its occupied rows are the first ``needed``: any
    count for eager graphs (``batch`` None), else the smallest of ``rows`` (smaller graphs) that holds
    them, else ``batch``."""
    if needed < 1 or (batch is not None and needed > batch):
        raise BucketError(f"a decode step over 1..{batch or 'any'} rows, found {needed}")
    if batch is None:
        return needed
    return min((r for r in rows if needed <= r < batch), default=batch)


@dataclass(frozen=True)
class PortShape:
    """Prompt buckets and KV lengths a port is built for (sorted, distinct; JSON-able).

    ``ring_buffers=False`` gives sliding owners full-length buffers (the field report's design).
    ``draft_tokens``: the most drafted tokens a verify step checks (speculative decoding; 0: none): the port gets
    verify graphs of 2 to ``draft_tokens + 1`` tokens and rings of ``window + draft_tokens`` slots.
    """

    buckets: tuple[int, ...]
    kv_lens: tuple[int, ...]
    ring_buffers: bool = True
    draft_tokens: int = 0

    def __init__(self, buckets: int | Sequence[int], kv_lens: int | Sequence[int], ring_buffers: bool = True,
                 draft_tokens: int = 0):
        object.__setattr__(self, "buckets", _sizes(buckets))
        object.__setattr__(self, "kv_lens", _sizes(kv_lens))
        object.__setattr__(self, "ring_buffers", bool(ring_buffers))
        object.__setattr__(self, "draft_tokens", int(draft_tokens))
        b, kv = self.buckets, self.kv_lens
        if not b or not kv or b[0] < 1 or b[-1] > kv[-1]:
            raise BucketError(f"prompt buckets {list(b)} must be positive and at most the largest KV length {list(kv)}")
        if self.draft_tokens < 0:
            raise BucketError(f"a verify step checks 0 or more drafted tokens, found draft_tokens={self.draft_tokens}")

    def to_json(self) -> dict[str, Any]:
        out = {"buckets": list(self.buckets), "kv_lens": list(self.kv_lens), "ring_buffers": self.ring_buffers}
        return {**out, "draft_tokens": self.draft_tokens} if self.draft_tokens else out

    def stores(self, layout: Layout, kv_heads: dict[int, int] | None = None) -> StoreShapes:
        """The shapes one rank gets (``kv_heads``: its local KV-head count per layer)."""
        return StoreShapes.of(layout, self, kv_heads)

    def rank_stores(self, setup: RankSetup) -> list[StoreShapes]:
        """The shapes every rank of ``setup`` builds, in rank order (what its graphs carry)."""
        return [self.stores(setup.layout, setup.plan.local_kv_heads(r)) for r in range(setup.tp)]


@dataclass(frozen=True)
class StoreShapes:
    """One rank's static shapes: the store at every KV length, and where each bucket writes.

    ``specs[kv]``: the KV store at KV length ``kv``; ``prefill_kv[bucket]``: the KV length a
    bucket's prefill writes into; ``rings[kv]``: the ring size of that store's sliding owners
    (None when it has no ring; read from the spec).
    """

    shape: PortShape
    specs: dict[int, KVStoreSpec]
    prefill_kv: dict[int, int]

    @classmethod
    def of(cls, layout: Layout, shape: PortShape, kv_heads: dict[int, int] | None = None) -> StoreShapes:
        specs = {kv: kv_store_spec(layout, kv, shape.ring_buffers, kv_heads, shape.draft_tokens) for kv in shape.kv_lens}
        prefill_kv = {b: next(kv for kv in shape.kv_lens if kv >= b) for b in shape.buckets}
        return cls(shape, specs, prefill_kv)

    @property
    def rings(self) -> dict[int, int | None]:
        """KV length -> the ring size of that store's sliding owners (None when it has no ring)."""
        return {kv: spec.ring for kv, spec in self.specs.items()}

    @property
    def buckets(self) -> list[int]:
        return list(self.shape.buckets)

    @property
    def kv_lens(self) -> list[int]:
        return list(self.shape.kv_lens)

    @property
    def kv_len(self) -> int:
        """The largest KV length (how far a request can grow)."""
        return self.shape.kv_lens[-1]

    @property
    def largest(self) -> KVStoreSpec:
        """The store at the largest KV length."""
        return self.specs[self.kv_len]

    def kv_layout(self) -> dict[str, list[dict[str, Any]]]:
        """JSON of every store's buffers (an artifact's manifest records it per rank)."""
        return {
            str(kv): [{"layer": s.layer, "attention": s.attention, "n_kv": s.n_kv, "head_dim": s.head_dim,
                       "slots": s.slots, "ring": s.ring} for s in spec.slots]
            for kv, spec in self.specs.items()
        }


__all__ = ["select_bucket", "occupancy_rows", "decode_rows_for", "rows_for", "PortShape", "StoreShapes"]
