"""The backend protocol: compile a static graph, save it, load it back.

A *runnable* is anything callable as ``runnable(*inputs) -> (logits, *kv)`` — an ``nn.Module``,
a TorchScript module, or a vendor executor. ``aliases`` maps input index -> output index for
tensors that should stay resident on the device (the KV store). Backends that keep the store on
the device (``neuron``, ``nxd``: :data:`RESIDENT_KV_BACKENDS`) bind one store, at the largest KV length,
to all of a rank's graphs; a decode graph of a shorter length reads a prefix of it
(:mod:`neuron_port.backends.nxd_artifact`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from neuron_port.graph.step import Runnable


class Backend(Protocol):
    name: str

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int],
                options: dict[str, Any] | None = None) -> Runnable: ...

    def save(self, runnable: Runnable, path: Path) -> None: ...

    def load(self, path: Path) -> Runnable: ...


RESIDENT_KV_BACKENDS = ("neuron", "nxd")


__all__ = ["Backend", "RESIDENT_KV_BACKENDS"]
