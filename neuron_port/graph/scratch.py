"""Preallocated host tensors for the decode step, filled in place every token.

The decode loop needs the same eight inputs every step — embeddings, positions, masks and
one-hot writes — for a fixed batch and KV length. :class:`DecodeScratch` allocates them once
and rewrites them with ``out=`` / in-place operations, so a step allocates nothing of the
mask or embedding size and runs no Python loop over layers or the vocabulary. The values are
exactly those of :mod:`neuron_port.graph.masks` (property-tested); the tensors are reused, so a
caller must consume one step's inputs before asking for the next.
"""

from __future__ import annotations

import torch

from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.step import StepInputs


class DecodeScratch:
    """Decode inputs for ``batch`` rows at one KV length (``ring`` slots for sliding owners, or None)."""

    # Ordinary tensors even when first made inside an inference-mode loop (the runtime's): they
    # outlive it and take in-place writes from code that runs outside it.
    @torch.inference_mode(False)
    def __init__(
        self, batch: int, kv_len: int, ring: int | None, window: int | None, embeddings: HostEmbeddings, dtype: torch.dtype
    ):
        self.batch, self.kv_len, self.ring, self.window = batch, kv_len, ring, window
        self.embeddings = embeddings
        sliding = ring or kv_len
        self.slots = torch.arange(kv_len)
        self.ring_slots = torch.arange(sliding)
        self.zero = torch.zeros((), dtype=dtype)
        self.blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype)
        self.ids = torch.zeros((batch, 1), dtype=torch.long)
        self.positions = torch.zeros((batch, 1), dtype=torch.long)
        self.words = torch.zeros((batch, 1, embeddings.hidden), dtype=embeddings.word.dtype)
        ple_width = embeddings.ple.shape[1] if embeddings.ple is not None else 0
        self.per_layer_flat = torch.zeros((batch, ple_width), dtype=embeddings.word.dtype)
        self.mask_full = torch.zeros((batch, 1, 1, kv_len), dtype=dtype)
        self.mask_sliding = torch.zeros((batch, 1, 1, sliding), dtype=dtype)
        self.write_full = torch.zeros((batch, 1, kv_len), dtype=dtype)
        self.write_sliding = torch.zeros((batch, 1, sliding), dtype=dtype)
        self.last = torch.ones((batch, 1), dtype=dtype)
        self._hit_full = torch.zeros((batch, kv_len), dtype=torch.bool)
        self._hit_sliding = torch.zeros((batch, sliding), dtype=torch.bool)
        self._held = torch.zeros((batch, sliding), dtype=torch.long)
        self._age = torch.zeros((batch, sliding), dtype=torch.long)

    def fill(self, tokens: torch.Tensor, positions: torch.Tensor) -> StepInputs:
        """tokens [batch], positions [batch] -> the decode step's inputs (these very tensors)."""
        b, kv = self.batch, self.kv_len
        pos = positions[:, None]
        self.ids.copy_(tokens[:, None])
        self.positions.copy_(pos)
        e = self.embeddings
        torch.index_select(e.word, 0, tokens, out=self.words.view(b, e.hidden))
        if e.word_scale is not None:
            self.words.mul_(e.word_scale)
        if e.ple is not None:
            torch.index_select(e.ple, 0, tokens, out=self.per_layer_flat)
            self.per_layer_flat.mul_(e.ple_scale)
        # full layers: slot s holds position s; visible when s <= t; the new token goes to slot t
        torch.le(self.slots[None, :], pos, out=self._hit_full)
        torch.where(self._hit_full, self.zero, self.blocked, out=self.mask_full.view(b, kv))
        torch.eq(self.slots[None, :], pos, out=self._hit_full)
        self.write_full.view(b, kv).copy_(self._hit_full)
        if self.window is None:
            # no sliding layers: the sliding inputs are unused; keep them equal to the full ones
            self.mask_sliding.copy_(self.mask_full)
            self.write_sliding.copy_(self.write_full)
        elif self.ring is None:
            # full-length sliding buffers: visible when 0 <= t - s < window; written like full layers
            torch.sub(pos, self.slots[None, :], out=self._age)
            torch.lt(self._age, self.window, out=self._hit_sliding)
            torch.ge(self._age, 0, out=self._hit_full)
            self._hit_sliding.logical_and_(self._hit_full)
            torch.where(self._hit_sliding, self.zero, self.blocked, out=self.mask_sliding.view(b, kv))
            self.write_sliding.copy_(self.write_full)
        else:
            # rings: slot s holds t - ((t - s) mod ring) once position t is written
            torch.sub(pos, self.ring_slots[None, :], out=self._age)
            torch.remainder(self._age, self.ring, out=self._age)
            torch.sub(pos, self._age, out=self._held)
            torch.ge(self._held, 0, out=self._hit_sliding)
            torch.where(self._hit_sliding, self.zero, self.blocked, out=self.mask_sliding.view(b, self.ring))
            torch.eq(self._age, 0, out=self._hit_sliding)
            self.write_sliding.view(b, self.ring).copy_(self._hit_sliding)
        per_layer = (
            self.per_layer_flat.view(b, 1, e.num_layers, -1)
            if e.ple is not None
            else self.per_layer_flat.view(b, 1, e.num_layers, 0)
        )
        return StepInputs(
            self.words,
            per_layer,
            self.positions,
            self.mask_full,
            self.mask_sliding,
            self.write_full,
            self.write_sliding,
            self.last,
        )


__all__ = ["DecodeScratch"]
