"""Buffers that parameter-only loaders drop, audited and restored.

Weight sharding in neuronx-distributed loads parameters only, never buffers. Gemma-4's
per-layer scalar is a buffer (real value about 0.06): left at its default 1.0, every layer
over-scales and the output collapses without any error. Which per-layer buffers matter, and
their defaults, is the family adapter's to say. These helpers list a
model's persistent buffers, compare them with a checkpoint, and copy the checkpoint's values in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class BufferDiff:
    name: str
    problem: str  # "differs" | "missing from checkpoint" | "shape"
    max_abs_diff: float | None = None

    def __str__(self) -> str:
        if self.max_abs_diff is not None:
            return f"{self.name}: {self.problem} (max |diff| {self.max_abs_diff:.4g})"
        return f"{self.name}: {self.problem}"


def persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers that belong in a checkpoint (non-persistent ones such as RoPE tables excluded)."""
    state = model.state_dict()
    params = {name for name, _ in model.named_parameters()}
    names = {name for name, _ in model.named_buffers()}
    return {k: v for k, v in state.items() if k in names and k not in params}


def audit_buffers(model: nn.Module, checkpoint: Mapping[str, torch.Tensor], atol: float = 0.0) -> list[BufferDiff]:
    """Every persistent buffer of ``model`` that the checkpoint lacks or disagrees with."""
    diffs = []
    for name, value in persistent_buffers(model).items():
        if name not in checkpoint:
            diffs.append(BufferDiff(name, "missing from checkpoint"))
            continue
        ref = checkpoint[name]
        if tuple(ref.shape) != tuple(value.shape):
            diffs.append(BufferDiff(name, f"shape {tuple(value.shape)} vs checkpoint {tuple(ref.shape)}"))
            continue
        delta = (value.double() - ref.double()).abs().max().item() if value.numel() else 0.0
        if delta > atol:
            diffs.append(BufferDiff(name, "differs from checkpoint", delta))
    return diffs


def restore_buffers(model: nn.Module, checkpoint: Mapping[str, torch.Tensor]) -> list[str]:
    """Copy every persistent buffer the checkpoint has into ``model``; returns the names set."""
    restored = []
    modules = dict(model.named_modules())
    for name in persistent_buffers(model):
        if name not in checkpoint:
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = modules[owner_name] if owner_name else model
        current = getattr(owner, attr)
        with torch.no_grad():
            current.copy_(checkpoint[name].to(current.dtype).reshape(current.shape))
        restored.append(name)
    return restored


def parameter_only_load(model: nn.Module, checkpoint: Mapping[str, torch.Tensor]) -> None:
    """Load parameters only and leave buffers at their defaults, as NxD's sharding does.

    Exists to reproduce the failure in tests and triage; never use it for a real port.
    """
    from neuron_port.families import family_of

    defaults = family_of(model).buffer_defaults()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if name in checkpoint:
                p.copy_(checkpoint[name].to(p.dtype))
        for name, buf in persistent_buffers(model).items():
            attr = name.rpartition(".")[2]
            if attr in defaults:
                buf.fill_(defaults[attr])


__all__ = ["BufferDiff", "persistent_buffers", "audit_buffers", "restore_buffers", "parameter_only_load"]
