"""Preallocated host tensors for the decode step, filled in place every token.

The decode loop needs the same four inputs every step (embeddings, per-layer inputs, positions and
lengths) for a fixed batch. :class:`DecodeScratch` allocates them once and rewrites them with
``out=`` / in-place operations, so a step allocates nothing of the embedding size. The values are
exactly those of :meth:`~neuron_port.graph.host_inputs.HostInputs.decode_fresh` (tested); the
tensors are reused, so a caller must consume one step's inputs before asking for the next. The
masks and write maps are the graph's to build (:func:`neuron_port.graph.masks.step_maps`).
"""

from __future__ import annotations

import torch

from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.step import StepInputs


class DecodeScratch:
    """Decode inputs for ``batch`` rows."""

    # Ordinary tensors even when first made inside an inference-mode loop (the runtime's): they
    # outlive it and take in-place writes from code that runs outside it.
    @torch.inference_mode(False)
    def __init__(self, batch: int, embeddings: HostEmbeddings):
        self.batch = batch
        self.embeddings = embeddings
        self.positions = torch.zeros((batch, 1), dtype=torch.long)
        self.lengths = torch.zeros((batch,), dtype=torch.long)
        self.words = torch.zeros((batch, 1, embeddings.hidden), dtype=embeddings.word.dtype)
        ple_width = embeddings.ple.shape[1] if embeddings.ple is not None else 0
        self.per_layer_flat = torch.zeros((batch, ple_width), dtype=embeddings.word.dtype)

    def fill(self, tokens: torch.Tensor, positions: torch.Tensor) -> StepInputs:
        """tokens [batch], positions [batch] -> the decode step's inputs (these very tensors)."""
        b = self.batch
        self.positions.copy_(positions[:, None])
        torch.add(positions, 1, out=self.lengths)
        e = self.embeddings
        torch.index_select(e.word, 0, tokens, out=self.words.view(b, e.hidden))
        if e.word_scale is not None:
            self.words.mul_(e.word_scale)
        if e.ple is not None:
            torch.index_select(e.ple, 0, tokens, out=self.per_layer_flat)
            self.per_layer_flat.mul_(e.ple_scale)
        per_layer = (
            self.per_layer_flat.view(b, 1, e.num_layers, -1)
            if e.ple is not None
            else self.per_layer_flat.view(b, 1, e.num_layers, 0)
        )
        return StepInputs(self.words, per_layer, self.positions, self.lengths)


__all__ = ["DecodeScratch"]
