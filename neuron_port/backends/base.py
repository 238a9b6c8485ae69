"""The backend protocol: compile a static graph, save it, load it back.

A *runnable* is anything callable as ``runnable(*inputs) -> (logits, *kv)`` — an ``nn.Module``,
a TorchScript module, or a vendor executor. ``aliases`` maps input index -> output index for
tensors that should stay resident on the device (the KV store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch
from torch import nn

Runnable = Callable[..., Sequence[torch.Tensor]]


class Backend(Protocol):
    name: str

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int],
                options: dict[str, Any] | None = None) -> Runnable: ...

    def save(self, runnable: Runnable, path: Path) -> None: ...

    def load(self, path: Path) -> Runnable: ...


__all__ = ["Backend", "Runnable"]
