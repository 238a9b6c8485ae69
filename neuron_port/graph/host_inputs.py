"""Every host-side input a graph step needs, built from token ids and positions.

:class:`HostInputs` gathers embeddings on the host and builds masks and one-hot write maps
(:mod:`neuron_port.graph.masks`) for one rank's :class:`~neuron_port.graph.shapes.StoreShapes`. Prefill
inputs are built fresh; decode inputs are written into tensors preallocated once per batch and
KV length (:class:`~neuron_port.graph.scratch.DecodeScratch`), so a decode step allocates nothing of
the mask or embedding size. ``example_*`` give inputs of the right shapes for tracing.
"""

from __future__ import annotations

import torch

from neuron_port.graph import masks
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.kv import KVStore
from neuron_port.graph.scratch import DecodeScratch
from neuron_port.graph.shapes import StoreShapes
from neuron_port.graph.step import StepInputs
from neuron_port.model.layout import Layout


class HostInputs:
    """Host inputs of one rank's graphs: embeddings plus masks and writes for its stores."""

    def __init__(self, layout: Layout, stores: StoreShapes, embeddings: HostEmbeddings):
        self.layout = layout
        self.stores = stores
        self.embeddings = embeddings
        self.dtype = embeddings.word.dtype
        self._positions = torch.arange(stores.buckets[-1])
        self._scratch: dict[tuple[int, int], DecodeScratch] = {}

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor, bucket: int) -> StepInputs:
        """ids [batch, bucket] right-padded, lengths [batch] -> the prefill step's inputs."""
        kv = self.stores.prefill_kv[bucket]
        embeds, per_layer = self.embeddings.embed(ids)
        positions = self._positions[:bucket].expand(ids.shape[0], bucket).contiguous()
        m_full, m_slide = masks.prefill_masks(lengths, bucket, self.layout.sliding_window, self.dtype)
        w_full, w_slide = masks.prefill_writes(lengths, bucket, kv, self.stores.rings[kv], self.dtype)
        last = masks.last_token_onehot(lengths, bucket, self.dtype)
        return StepInputs(embeds, per_layer, positions, m_full, m_slide, w_full, w_slide, last)

    def decode_fresh(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int) -> StepInputs:
        """tokens [batch], positions [batch] -> the decode step's inputs at ``kv_len`` (new tensors)."""
        ring = self.stores.rings[kv_len]
        embeds, per_layer = self.embeddings.embed(tokens[:, None])
        m_full, m_slide = masks.decode_masks(positions, kv_len, self.layout.sliding_window, ring, self.dtype)
        w_full, w_slide = masks.decode_writes(positions, kv_len, ring, self.dtype)
        last = torch.ones((tokens.shape[0], 1), dtype=self.dtype)
        return StepInputs(embeds, per_layer, positions[:, None], m_full, m_slide, w_full, w_slide, last)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int) -> StepInputs:
        """The same values as :meth:`decode_fresh`, written into tensors reused every step:
        consume them before the next call."""
        key = (int(tokens.shape[0]), kv_len)
        if key not in self._scratch:
            self._scratch[key] = DecodeScratch(key[0], kv_len, self.stores.rings[kv_len], self.layout.sliding_window,
                                               self.embeddings, self.dtype)
        return self._scratch[key].fill(tokens, positions)

    def new_store(self, batch: int, kv_len: int) -> KVStore:
        """A zeroed store at ``kv_len`` for ``batch`` rows."""
        return KVStore.zeros(self.stores.specs[kv_len], batch, self.dtype)

    def example_prefill(self, bucket: int, batch: int = 1) -> tuple[StepInputs, KVStore]:
        """Inputs of the right shapes (a full-bucket prompt) for tracing a prefill graph."""
        ids = torch.arange(bucket)[None, :].expand(batch, bucket) % self.layout.vocab_size
        inputs = self.prefill(ids.contiguous(), torch.full((batch,), bucket), bucket)
        return inputs, self.new_store(batch, self.stores.prefill_kv[bucket])

    def example_decode(self, kv_len: int, batch: int = 1) -> tuple[StepInputs, KVStore]:
        """Inputs of the right shapes for tracing a decode graph."""
        inputs = self.decode_fresh(torch.full((batch,), 3), torch.full((batch,), kv_len - 1), kv_len)
        return inputs, self.new_store(batch, kv_len)


__all__ = ["HostInputs"]
