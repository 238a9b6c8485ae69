"""Deprecated facade (kept for one release): ``generate_with_port`` and ``GenerationJob``.

Use :func:`neuron_port.generation.generate`, which takes a model, an artifact directory or a
port, and returns a :class:`~neuron_port.generation.GenerationResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from neuron_port.generation import generate
from neuron_port.kvcache import naive_kv_bytes
from neuron_port.layout import describe
from neuron_port.shapes import PortShape


@dataclass
class GenerationJob:
    """Prompts, lengths and store shape of one greedy run (JSON-able)."""

    prompts: list[list[int]]
    max_new_tokens: int
    buckets: list[int]
    kv_len: int
    stop_ids: list[int] = field(default_factory=list)
    ring_buffers: bool = True
    keep_logits: bool = False


def generate_with_port(model: nn.Module, job: GenerationJob, tp: int = 1, in_process: bool = False) -> dict[str, Any]:
    """Greedy generation through the two-graph port; ``tp > 1`` runs gloo ranks (or threads).

    ``model`` is not modified. The result's ``kv_cache_bytes`` sums every rank's store."""
    result = generate(model, job.prompts, job.max_new_tokens, stop_ids=job.stop_ids, tp=tp,
                      shape=PortShape(job.buckets, job.kv_len, job.ring_buffers),
                      mode="threads" if in_process else "gloo", keep_logits=job.keep_logits)
    out = result.to_json()
    if job.keep_logits:
        out["step_logits"] = [step.tolist() for step in result.step_logits]
    return out


def naive_bytes_for(model: nn.Module, kv_len: int, batch: int, dtype_bytes: int) -> int:
    return naive_kv_bytes(describe(model), kv_len, batch, dtype_bytes)


__all__ = ["GenerationJob", "generate_with_port", "naive_bytes_for"]
