"""A two-graph port assembled from the primitives.

``Port`` owns the host embeddings, one prefill graph per prompt bucket, one decode graph per
KV length, and the KV store spec of each KV length. ``host_inputs_*`` build every host-side
tensor a graph step needs (masks, one-hot writes, positions, embeddings) from index tensors
prepared once. Generation loops live in :mod:`neuron_port.runtime`; :func:`greedy_generate`
is the greedy shortcut over them.

Bucket rules: a prompt goes to the first prompt bucket that holds it; the bucket's prefill
writes into the smallest KV length that holds the bucket; decoding moves to the next KV
length (copying the store) when a row outgrows it, or stops that row with ``length``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from neuron_port import masks
from neuron_port.embedding import HostEmbeddings
from neuron_port.errors import BucketError
from neuron_port.graphs import DecodeGraph, PrefillGraph
from neuron_port.kvcache import KVStoreSpec, grow, kv_store_spec
from neuron_port.layout import Layout
from neuron_port.scratch import DecodeScratch

Runnable = Callable[..., Sequence[torch.Tensor]]


def select_bucket(length: int, buckets: Sequence[int]) -> int:
    """First bucket that holds ``length`` tokens; a clear error when none does."""
    for bucket in sorted(buckets):
        if length <= bucket:
            return bucket
    raise BucketError(
        f"prompt of {length} tokens is longer than the largest prompt bucket ({max(buckets)}); "
        f"use a shorter prompt or build the port with a larger bucket"
    )


class Port:
    """Host embeddings + static graphs + KV store specs for one model (one TP rank)."""

    def __init__(
        self,
        model: nn.Module | None,
        layout: Layout,
        prompt_buckets: Sequence[int],
        kv_lens: int | Sequence[int],
        ring_buffers: bool = True,
        kv_heads: dict[int, int] | None = None,
        embeddings: HostEmbeddings | None = None,
        runners: tuple[dict[int, Runnable], dict[int, Runnable]] | None = None,
        batch: int | None = None,
    ):
        """Build graphs over ``model``, or (``model=None``) use ``runners`` = (prefill by bucket,
        decode by KV length) loaded from an artifact together with ``embeddings``; ``batch``:
        the rows such runners were compiled for (None: any)."""
        buckets = sorted(set(int(b) for b in prompt_buckets))
        kvs = sorted(set([int(kv_lens)] if isinstance(kv_lens, int) else [int(k) for k in kv_lens]))
        if not buckets or not kvs or buckets[-1] > kvs[-1] or buckets[0] < 1:
            raise BucketError(f"prompt buckets {buckets} must be positive and at most the largest KV length {kvs}")
        if model is None and (runners is None or embeddings is None):
            raise ValueError("a Port without a model needs both runners and embeddings")
        self.layout = layout
        self.buckets = buckets
        self.kv_lens = kvs
        self.specs: dict[int, KVStoreSpec] = {kv: kv_store_spec(layout, kv, ring_buffers, kv_heads) for kv in kvs}
        self.rings = {kv: (layout.sliding_window if any(s.ring for s in spec.slots) else None)
                      for kv, spec in self.specs.items()}
        self.prefill_kv = {b: next(kv for kv in kvs if kv >= b) for b in buckets}
        self.embeddings = embeddings or HostEmbeddings.from_model(model)
        self.dtype = self.embeddings.word.dtype
        if model is not None:
            self.prefill_graphs = {b: PrefillGraph(model, self.specs[self.prefill_kv[b]], b) for b in buckets}
            self.decode_graphs = {kv: DecodeGraph(model, self.specs[kv]) for kv in kvs}
        else:
            self.prefill_graphs, self.decode_graphs = {}, {}
        # What actually runs; a backend replaces these with compiled runnables.
        prefill, decode = runners if runners is not None else (self.prefill_graphs, self.decode_graphs)
        self.prefill_runners: dict[int, Runnable] = dict(prefill)
        self.decode_runners: dict[int, Runnable] = dict(decode)
        # Rows the runners take: None while they are the eager graphs (any batch), the compiled
        # batch once a static-shape backend compiled them (see check_batch).
        self.batch: int | None = batch
        self._positions = torch.arange(buckets[-1])
        self._scratch: dict[tuple[int, int], DecodeScratch] = {}

    def example_inputs_prefill(self, bucket: int, batch: int = 1) -> list[torch.Tensor]:
        """Inputs of the right shapes (a full-bucket prompt) for tracing a prefill graph."""
        ids = torch.arange(bucket)[None, :].expand(batch, bucket) % self.layout.vocab_size
        inputs = self.host_inputs_prefill(ids.contiguous(), torch.full((batch,), bucket), bucket)
        return inputs + self.new_store(batch, self.prefill_kv[bucket])

    def example_inputs_decode(self, kv_len: int, batch: int = 1) -> list[torch.Tensor]:
        """Inputs of the right shapes for tracing a decode graph."""
        pos = torch.full((batch,), kv_len - 1)
        return self.host_inputs_decode(torch.full((batch,), 3), pos, kv_len) + self.new_store(batch, kv_len)

    def compile(self, backend, batch: int = 1) -> None:
        """Replace every runner with ``backend.compile(graph, example inputs, aliases)``.

        Graphs compiled by a static-shape backend (``backend.static_batch``, true unless the
        backend says otherwise) take exactly ``batch`` rows from then on."""
        for b, graph in self.prefill_graphs.items():
            self.prefill_runners[b] = backend.compile(graph, self.example_inputs_prefill(b, batch), graph.aliases)
        for kv, graph in self.decode_graphs.items():
            graph.inplace_kv_writes = bool(getattr(backend, "inplace_kv_writes", False))
            self.decode_runners[kv] = backend.compile(graph, self.example_inputs_decode(kv, batch), graph.aliases)
        self.batch = batch if getattr(backend, "static_batch", True) else None

    def check_batch(self, rows: int) -> None:
        """Raise :class:`BucketError` when compiled runners cannot take ``rows`` rows."""
        if self.batch is not None and rows != self.batch:
            raise BucketError(f"the compiled graphs take batch {self.batch}, found {rows} prompts; pad the batch to "
                              f"{self.batch} rows (the server's engine does) or compile with batch={rows}")

    @property
    def kv_len(self) -> int:
        """The largest KV length (how far a request can grow)."""
        return self.kv_lens[-1]

    @property
    def spec(self) -> KVStoreSpec:
        """The store at the largest KV length."""
        return self.specs[self.kv_len]

    @property
    def decode_graph(self) -> DecodeGraph:
        return self.decode_graphs[self.kv_len]

    # ---- host-side inputs ------------------------------------------------------------------
    def host_inputs_prefill(self, ids: torch.Tensor, lengths: torch.Tensor, bucket: int) -> list[torch.Tensor]:
        """ids [batch, bucket] right-padded, lengths [batch] -> the prefill graph's 8 inputs."""
        kv = self.prefill_kv[bucket]
        embeds, per_layer = self.embeddings.embed(ids)
        positions = self._positions[:bucket].expand(ids.shape[0], bucket).contiguous()
        m_full, m_slide = masks.prefill_masks(lengths, bucket, self.layout.sliding_window, self.dtype)
        w_full, w_slide = masks.prefill_writes(lengths, bucket, kv, self.rings[kv], self.dtype)
        last = masks.last_token_onehot(lengths, bucket, self.dtype)
        return [embeds, per_layer, positions, m_full, m_slide, w_full, w_slide, last]

    def decode_inputs(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int | None = None) -> list[torch.Tensor]:
        """The decode step's 8 inputs written into preallocated tensors (reused every step).

        Same values as :meth:`host_inputs_decode`; consume them before the next call.
        """
        kv = kv_len or self.kv_len
        key = (int(tokens.shape[0]), kv)
        if key not in self._scratch:
            self._scratch[key] = DecodeScratch(key[0], kv, self.rings[kv], self.layout.sliding_window, self.embeddings, self.dtype)
        return self._scratch[key].fill(tokens, positions)

    def host_inputs_decode(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int | None = None) -> list[torch.Tensor]:
        """tokens [batch], positions [batch] -> the decode graph's 8 inputs for ``kv_len`` (fresh tensors)."""
        kv = kv_len or self.kv_len
        ring = self.rings[kv]
        embeds, per_layer = self.embeddings.embed(tokens[:, None])
        m_full, m_slide = masks.decode_masks(positions, kv, self.layout.sliding_window, ring, self.dtype)
        w_full, w_slide = masks.decode_writes(positions, kv, ring, self.dtype)
        last = torch.ones((tokens.shape[0], 1), dtype=self.dtype)
        return [embeds, per_layer, positions[:, None], m_full, m_slide, w_full, w_slide, last]

    def new_store(self, batch: int, kv_len: int | None = None) -> list[torch.Tensor]:
        return self.specs[kv_len or self.kv_len].allocate(batch, self.dtype)

    def grow_store(self, store: list[torch.Tensor], old_kv: int, new_kv: int, last_position: torch.Tensor) -> list[torch.Tensor]:
        return grow(store, self.specs[old_kv], self.specs[new_kv], last_position)


@dataclass
class GreedyResult:
    """Tokens of each row and timings of a greedy run."""

    tokens: list[list[int]]
    finish_reasons: list[str]
    prefill_s: float
    decode_s: float
    decode_steps: int
    host_s: float = 0.0
    step_logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def decode_tok_per_s(self) -> float | None:
        return round(self.decode_steps / self.decode_s, 3) if self.decode_s > 0 else None

    def to_json(self) -> dict:
        """Tokens, finish reasons and timings as JSON-able data (logits excluded)."""
        return {"tokens": self.tokens, "finish_reasons": self.finish_reasons, "prefill_s": self.prefill_s,
                "decode_s": self.decode_s, "decode_steps": self.decode_steps, "host_s": self.host_s,
                "decode_tok_per_s": self.decode_tok_per_s}


def greedy_generate(
    port: Port,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    keep_logits: bool = False,
) -> GreedyResult:
    """Greedy decoding of a batch of prompts over the port's graphs (see :class:`runtime.Generator`)."""
    from neuron_port.runtime import GenerationParams, Generator

    params = GenerationParams(max_new_tokens=max_new_tokens, stop_token_ids=tuple(stop_ids))
    run = Generator(port, pad_id=pad_id).run_batch(list(prompts), params, keep_logits=keep_logits)
    return GreedyResult(
        tokens=[c.tokens for c in run.completions],
        finish_reasons=[c.finish_reason for c in run.completions],
        prefill_s=run.prefill_s,
        decode_s=run.decode_s,
        decode_steps=run.decode_steps,
        host_s=run.host_s,
        step_logits=run.step_logits,
    )


__all__ = ["Port", "select_bucket", "GreedyResult", "greedy_generate"]
