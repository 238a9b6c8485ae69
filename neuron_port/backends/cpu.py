"""CPU backend: eager (the graph module itself) or compiled with TorchScript tracing.

Tracing was chosen over ``torch.export`` and ``torch.compile`` because the traced (and frozen)
graph removes the Hugging Face forward's Python overhead, saves and loads with ``torch.jit.save`` /
``torch.jit.load`` exactly like the Neuron backend's artifacts, and carries the TP all-reduce
as a custom op. ``benchmarks/cpu_backend.py`` measures it against eager.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from neuron_port.backends.base import Runnable


class CpuBackend:
    def __init__(self, mode: str = "jit"):
        if mode not in ("jit", "eager"):
            raise ValueError(f"cpu backend mode must be 'jit' or 'eager', found {mode!r}")
        self.mode = mode
        self.name = "cpu"
        # Traced decode graphs write the new token's K/V in place (scatter) rather than
        # re-writing every buffer with a one-hot blend: on a CPU the blend is a full pass over
        # the KV store per step. Eager mode keeps the device graphs' exact ops.
        self.inplace_kv_writes = mode == "jit"

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int],
                options: dict[str, Any] | None = None) -> Runnable:
        if self.mode == "eager":
            return graph
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            traced = torch.jit.trace(graph, tuple(example_inputs), check_trace=False, strict=False)
            # Freezing inlines the weights as constants: no attribute lookups per op at run time.
            return torch.jit.freeze(traced.eval())

    def save(self, runnable: Runnable, path: Path) -> None:
        if not isinstance(runnable, torch.jit.ScriptModule):
            raise TypeError("only compiled (jit) CPU graphs are saved; compile with mode='jit'")
        torch.jit.save(runnable, str(path))

    def load(self, path: Path) -> Runnable:
        import neuron_port.collectives  # noqa: F401  (registers the all-reduce op traced graphs call)

        return torch.jit.load(str(path), map_location="cpu")


__all__ = ["CpuBackend"]
