"""Every host-side input a graph step needs, built from token ids and positions.

:class:`HostInputs` gathers embeddings on the host and hands each row's position ids and length to
the graphs of one rank's :class:`~neuron_port.graph.shapes.StoreShapes`; the graphs build their masks
and write maps from them (:func:`neuron_port.graph.masks.step_maps`). Prefill inputs
are built fresh; decode inputs are written into tensors preallocated once per batch size
(:class:`~neuron_port.graph.scratch.DecodeScratch`), so a decode step allocates nothing of the
embedding size. ``example_*`` give inputs of the right shapes for tracing.
"""

from __future__ import annotations

import torch

from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.kv import KVStore
from neuron_port.graph.scratch import DecodeScratch
from neuron_port.graph.shapes import StoreShapes
from neuron_port.graph.step import StepInputs
from neuron_port.model.layout import Layout


class HostInputs:
    """Host inputs of one rank's graphs: embeddings, position ids and each row's length."""

    def __init__(self, layout: Layout, stores: StoreShapes, embeddings: HostEmbeddings):
        self.layout = layout
        self.stores = stores
        self.embeddings = embeddings
        self.dtype = embeddings.word.dtype
        self._positions = torch.arange(stores.buckets[-1])
        self._scratch: dict[int, DecodeScratch] = {}

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor, bucket: int) -> StepInputs:
        """ids [batch, bucket] right-padded, lengths [batch] (each in 0..bucket; 0 writes nothing) ->
        the prefill step's inputs."""
        if ids.ndim != 2 or ids.shape[1] != bucket or lengths.shape != (ids.shape[0],):
            raise ValueError(f"prefill expects ids [batch, {bucket}] and lengths [batch], found {tuple(ids.shape)} "
                             f"and {tuple(lengths.shape)}")
        if len(lengths) and (int(lengths.min()) < 0 or int(lengths.max()) > bucket):
            raise ValueError(f"prefill expects lengths in 0..{bucket} (the bucket), found {lengths.tolist()}")
        embeds, per_layer = self.embeddings.embed(ids)
        positions = self._positions[:bucket].expand(ids.shape[0], bucket).contiguous()
        return StepInputs(embeds, per_layer, positions, lengths.to(torch.long))

    def decode_fresh(self, tokens: torch.Tensor, positions: torch.Tensor) -> StepInputs:
        """tokens [batch], positions [batch] -> the decode step's inputs (new tensors; the same at every KV
        length: the graph builds its masks and one-hot writes from the positions)."""
        embeds, per_layer = self.embeddings.embed(tokens[:, None])
        positions = positions.to(torch.long)
        return StepInputs(embeds, per_layer, positions[:, None], positions + 1)

    def verify(self, tokens: torch.Tensor, start: torch.Tensor) -> StepInputs:
        """tokens [batch, S] (the last accepted token, then the drafted ones), start [batch] (the first one's position)
        -> a verify step's inputs: positions ``start .. start + S - 1``, lengths ``start + S``."""
        if tokens.ndim != 2 or start.shape != (tokens.shape[0],):
            raise ValueError(f"a verify step takes tokens [batch, S] and start [batch], found {tuple(tokens.shape)} and "
                             f"{tuple(start.shape)}")
        embeds, per_layer = self.embeddings.embed(tokens)
        positions = start.to(torch.long)[:, None] + torch.arange(tokens.shape[1])[None, :]
        return StepInputs(embeds, per_layer, positions, positions[:, -1] + 1)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> StepInputs:
        """The same values as :meth:`decode_fresh`, written into tensors reused every step (one set per
        batch size): consume them before the next call."""
        batch = int(tokens.shape[0])
        if batch not in self._scratch:
            self._scratch[batch] = DecodeScratch(batch, self.embeddings)
        return self._scratch[batch].fill(tokens, positions)

    def new_store(self, batch: int, kv_len: int) -> KVStore:
        """A zeroed store at ``kv_len`` for ``batch`` rows."""
        return KVStore.zeros(self.stores.specs[kv_len], batch, self.dtype)

    def example_step(self, kind: str, size: int, batch: int = 1) -> StepInputs:
        """Step inputs of the right shapes for tracing the ``kind`` (``prefill``: a full prompt of bucket ``size``;
        ``decode``: one token at KV length ``size``; ``verify``: ``size`` tokens ending at the largest KV length's
        last position) graph over ``batch`` rows."""
        if kind == "prefill":
            ids = torch.arange(size)[None, :].expand(batch, size) % self.layout.vocab_size
            return self.prefill(ids.contiguous(), torch.full((batch,), size), size)
        if kind == "verify":
            return self.verify(torch.full((batch, size), 3), torch.full((batch,), self.stores.kv_len - size))
        return self.decode_fresh(torch.full((batch,), 3), torch.full((batch,), size - 1))

    def example_prefill(self, bucket: int, batch: int = 1) -> tuple[StepInputs, KVStore]:
        """Inputs of the right shapes (a full-bucket prompt) for tracing a prefill graph, and its store."""
        return self.example_step("prefill", bucket, batch), self.new_store(batch, self.stores.prefill_kv[bucket])

    def example_verify(self, tokens: int, batch: int = 1) -> tuple[StepInputs, KVStore]:
        """Inputs of the right shapes for tracing a verify graph of ``tokens`` tokens, and its store (the largest)."""
        return self.example_step("verify", tokens, batch), self.new_store(batch, self.stores.kv_len)

    def example_decode(self, kv_len: int, batch: int = 1) -> tuple[StepInputs, KVStore]:
        """Inputs of the right shapes for tracing a decode graph, and its store."""
        return self.example_step("decode", kv_len, batch), self.new_store(batch, kv_len)


__all__ = ["HostInputs"]
