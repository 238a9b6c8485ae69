"""CPU backend: eager (the graph module itself) or compiled with TorchScript tracing.

Tracing was chosen over ``torch.export`` and ``torch.compile`` because the traced (and frozen)
graph removes the Hugging Face forward's Python overhead, saves and loads with ``torch.jit.save`` /
``torch.jit.load`` exactly like the Neuron backend's artifacts, and carries the TP all-reduce
as a custom op. With ``passes=True`` (the default) the traced graph also goes through
:mod:`neuron_port.backends.static_graph_passes` (constant sizes, no-op casts dropped, few-row
query-key products swapped, wide weights pre-transposed); such a graph runs only with the shapes
it was traced with.
``benchmarks/cpu_backend.py`` measures eager, traced and traced-with-passes against each other.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from neuron_port.backends.static_graph_passes import optimize_traced
from neuron_port.backends.weight_pool import WeightPool, bind_graphs, save_lifted, view_key
from neuron_port.graph.kv import KVWrite
from neuron_port.graph.step import Runnable


class CpuBackend:
    def __init__(self, mode: str = "jit", passes: bool = True):
        if mode not in ("jit", "eager"):
            raise ValueError(f"cpu backend mode must be 'jit' or 'eager', found {mode!r}")
        self.mode = mode
        self.passes = passes
        self.name = "cpu"
        # Compiled graphs take only the batch they were compiled for (Port.batch enforces it).
        self.fixed_batch = mode == "jit"
        # Nodes each pass changed, summed over the graphs this backend compiled.
        self.pass_counts: dict[str, int] = {}
        # Transposed weight copies, shared by every graph this backend freezes from one model.
        self._transposed: dict = {}
        # Traced decode graphs write the new token's K/V in place (scatter) rather than
        # re-writing every buffer with a one-hot blend: on a CPU the blend is a full pass over
        # the KV store per step. Eager mode keeps the reference's exact ops.
        self.kv_write = KVWrite.IN_PLACE if mode == "jit" else KVWrite.BLEND
        self.inference_mode = True  # its runnables may run under torch.inference_mode
        self.leading_update = None  # a prefill writes its prompt rows by slice_scatter

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int],
                options: dict[str, Any] | None = None) -> Runnable:
        if self.mode == "eager":
            return graph
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            # TorchScript's module walker reads every attribute of every module's class (dir, then
            # getattr), transformers' deprecated is_gradient_checkpointing property among them; the
            # graphs never use it, and the walker has no way to skip an inherited property.
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
            traced = torch.jit.trace(graph, tuple(example_inputs), check_trace=False, strict=False)
            if not self.passes:
                # Freezing inlines the weights as constants: no attribute lookups per op at run time.
                return torch.jit.freeze(traced.eval())
            frozen, counts = optimize_traced(traced, self._transposed)
            for name, count in counts.items():
                self.pass_counts[name] = self.pass_counts.get(name, 0) + count
            return frozen

    def save_graphs(self, graphs: Mapping[str, Runnable], rank_dir: Path, named: Mapping[str, torch.Tensor]) -> list[Path]:
        """Every graph of a rank with its weights lifted into one pool (:mod:`weight_pool`):
        ``named`` ({name: tensor}) names the pooled tensors, ``host:`` ones are not stored."""
        for file, runnable in graphs.items():
            if not isinstance(runnable, torch.jit.ScriptModule):
                raise TypeError(f"{file}: only compiled (jit) CPU graphs are saved; compile with mode='jit'")
        transposed = {view_key(copy): view_key(weight) for weight, copy in self._transposed.values()}
        return save_lifted(graphs, rank_dir, WeightPool(named, transposed))

    def load_graphs(self, rank_dir: Path, files: Sequence[str], host: Mapping[str, torch.Tensor]) -> dict[str, Runnable]:
        """The graphs :meth:`save_graphs` wrote, all bound to one copy of the rank's weights."""
        return bind_graphs(rank_dir, files, host)


__all__ = ["CpuBackend"]
