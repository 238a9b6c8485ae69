"""A two-graph port assembled from the primitives, and its greedy generation loop.

``Port`` owns the host embeddings, one prefill graph per prompt bucket, one decode graph, and
the KV store spec. ``host_inputs_*`` build every host-side tensor a graph step needs (masks,
one-hot writes, positions, embeddings). ``greedy_generate`` runs
host embed -> prefill -> decode loop -> host argmax.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from neuron_port import masks
from neuron_port.embedding import HostEmbeddings
from neuron_port.errors import BucketError
from neuron_port.graphs import DecodeGraph, PrefillGraph
from neuron_port.kvcache import KVStoreSpec, kv_store_spec
from neuron_port.layout import Layout
from neuron_port.logits import greedy

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
    """Host embeddings + static graphs + KV store spec for one model (one TP rank)."""

    def __init__(
        self,
        model: nn.Module,
        layout: Layout,
        prompt_buckets: Sequence[int],
        kv_len: int,
        ring_buffers: bool = True,
        kv_heads: dict[int, int] | None = None,
        embeddings: HostEmbeddings | None = None,
    ):
        buckets = sorted(set(int(b) for b in prompt_buckets))
        if not buckets or buckets[-1] > kv_len:
            raise BucketError(f"prompt buckets {buckets} must be non-empty and at most the KV length {kv_len}")
        self.layout = layout
        self.buckets = buckets
        self.kv_len = kv_len
        self.spec: KVStoreSpec = kv_store_spec(layout, kv_len, ring_buffers, kv_heads)
        self.ring = layout.sliding_window if any(s.ring for s in self.spec.slots) else None
        self.embeddings = embeddings or HostEmbeddings.from_model(model)
        self.dtype = self.embeddings.word.dtype
        self.prefill_graphs = {b: PrefillGraph(model, self.spec, b) for b in buckets}
        self.decode_graph = DecodeGraph(model, self.spec)
        # What actually runs; a backend may replace these with compiled runnables.
        self.prefill_runners: dict[int, Runnable] = dict(self.prefill_graphs)
        self.decode_runner: Runnable = self.decode_graph

    # ---- host-side inputs ------------------------------------------------------------------
    def host_inputs_prefill(self, ids: torch.Tensor, lengths: torch.Tensor, bucket: int) -> list[torch.Tensor]:
        """ids [batch, bucket] right-padded, lengths [batch] -> the prefill graph's 8 inputs."""
        embeds, per_layer = self.embeddings.embed(ids)
        positions = torch.arange(bucket)[None, :].expand(ids.shape[0], bucket).contiguous()
        m_full, m_slide = masks.prefill_masks(lengths, bucket, self.layout.sliding_window, self.dtype)
        w_full, w_slide = masks.prefill_writes(lengths, bucket, self.kv_len, self.ring, self.dtype)
        last = masks.last_token_onehot(lengths, bucket, self.dtype)
        return [embeds, per_layer, positions, m_full, m_slide, w_full, w_slide, last]

    def host_inputs_decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> list[torch.Tensor]:
        """tokens [batch], positions [batch] -> the decode graph's 8 inputs."""
        embeds, per_layer = self.embeddings.embed(tokens[:, None])
        m_full, m_slide = masks.decode_masks(positions, self.kv_len, self.layout.sliding_window, self.ring, self.dtype)
        w_full, w_slide = masks.decode_writes(positions, self.kv_len, self.ring, self.dtype)
        last = torch.ones((tokens.shape[0], 1), dtype=self.dtype)
        return [embeds, per_layer, positions[:, None], m_full, m_slide, w_full, w_slide, last]

    def new_store(self, batch: int) -> list[torch.Tensor]:
        return self.spec.allocate(batch, self.dtype)


@dataclass
class GreedyResult:
    """Tokens of each row and timings of the run."""

    tokens: list[list[int]]
    finish_reasons: list[str]
    prefill_s: float
    decode_s: float
    decode_steps: int
    host_s: float = 0.0
    step_logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def decode_tok_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


def _pad(prompts: Sequence[Sequence[int]], bucket: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(prompts), bucket), pad_id, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(list(prompt), dtype=torch.long)
    return ids, torch.tensor([len(p) for p in prompts], dtype=torch.long)


@torch.no_grad()
def greedy_generate(
    port: Port,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    keep_logits: bool = False,
) -> GreedyResult:
    """Greedy decoding of a batch of prompts over the port's two graphs.

    A row stops at a stop id (kept in its tokens), after ``max_new_tokens``, or when its
    next position would not fit the KV length (finish reason ``length``). Finished rows keep
    running as padding without affecting the others.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, found {max_new_tokens}")
    lengths_list = [len(p) for p in prompts]
    if min(lengths_list) < 1:
        raise ValueError("every prompt needs at least one token")
    bucket = select_bucket(max(lengths_list), port.buckets)
    t0 = time.perf_counter()
    ids, lengths = _pad(prompts, bucket, pad_id)
    inputs = port.host_inputs_prefill(ids, lengths, bucket)
    host = time.perf_counter() - t0
    out = port.prefill_runners[bucket](*inputs, *port.new_store(len(prompts)))
    logits, store = out[0], list(out[1:])
    prefill_s = time.perf_counter() - t0
    stops = set(int(s) for s in stop_ids)
    batch = len(prompts)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    done = [False] * batch
    reasons = ["length"] * batch
    kept = [logits.clone()] if keep_logits else []
    next_tok = greedy(logits)
    positions = lengths.clone()
    steps = 0
    t_dec = time.perf_counter()
    while True:
        for row in range(batch):
            if done[row]:
                continue
            tok = int(next_tok[row])
            tokens[row].append(tok)
            if tok in stops:
                done[row], reasons[row] = True, "stop"
            elif len(tokens[row]) >= max_new_tokens or int(positions[row]) >= port.kv_len:
                done[row], reasons[row] = True, "length"
        if all(done):
            break
        h0 = time.perf_counter()
        step_pos = torch.clamp(positions, max=port.kv_len - 1)
        inputs = port.host_inputs_decode(next_tok, step_pos)
        host += time.perf_counter() - h0
        out = port.decode_runner(*inputs, *store)
        logits, store = out[0], list(out[1:])
        if keep_logits:
            kept.append(logits.clone())
        next_tok = greedy(logits)
        positions = positions + 1
        steps += 1
    decode_s = time.perf_counter() - t_dec
    return GreedyResult(tokens, reasons, prefill_s, decode_s, steps, host, kept)


__all__ = ["Port", "select_bucket", "GreedyResult", "greedy_generate"]
