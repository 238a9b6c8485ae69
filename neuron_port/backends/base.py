"""The backend protocol: compile a static graph, save it, load it back.

A *runnable* is anything callable as ``runnable(*inputs) -> (logits, *kv)`` — an ``nn.Module``,
a TorchScript module, or a vendor executor. ``aliases`` maps input index -> output index for
tensors that should stay resident on the device (the KV store). Backends that keep the store on
the device (``neuron``, ``nxd``) bind one store to all of a rank's graphs, so an artifact of theirs
has one KV length (:func:`check_single_kv_length`).
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


def check_single_kv_length(kv_lens: Sequence[int], backend: str) -> None:
    """Refuse several KV lengths for a backend whose graphs share one device-resident store."""
    if backend in RESIDENT_KV_BACKENDS and len(kv_lens) != 1:
        raise ValueError(f"a {backend} artifact keeps one KV store on the device, shared by all its graphs, so it "
                         f"takes one KV length; found kv_lens {list(kv_lens)}: pass one (e.g. --kv-lens {max(kv_lens)})")


__all__ = ["Backend", "RESIDENT_KV_BACKENDS", "check_single_kv_length"]
