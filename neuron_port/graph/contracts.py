"""The contracts a backend meets, as the code that uses them (:mod:`neuron_port.graph.runners`) reads them.

A *runnable* is anything callable as ``runnable(*inputs) -> (logits, *kv)``: an ``nn.Module``, a
TorchScript module, or a vendor executor. Which names meet which contract is declared in
:mod:`neuron_port.backends.registry`.

* :class:`GraphCompiler` (``cpu``, ``cpu-eager``, ``xla``): :func:`~neuron_port.graph.runners.compile_graphs`
  hands it each graph of a port with example inputs and the aliases of its KV tensors (input index ->
  output index: tensors that should stay resident on the device), after setting the graph's KV write to
  the backend's ``kv_write``.
* :class:`ArtifactGraphs` (``cpu``, ``cpu-eager``, ``neuron``, ``nxd``): :func:`~neuron_port.graph.runners.load_runners`
  loads a rank's graphs from an artifact; :class:`GraphSaver` (``cpu``) also saves them
  (:func:`~neuron_port.graph.runners.save_runners`). ``neuron`` and ``nxd`` artifacts are written whole by
  ModelBuilder (:func:`~neuron_port.backends.nxd_artifact.write_nxd_rank`), one KV store on the device at the
  largest length bound to every graph; a decode graph of a shorter length reads a prefix of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from neuron_port.graph.kv import KVWrite
from neuron_port.graph.step import Runnable


@runtime_checkable
class GraphCompiler(Protocol):
    """Compiles one graph at a time in this process. ``fixed_batch``: a compiled graph takes only the batch it
    was compiled for; ``inference_mode``: its runnables may run under ``torch.inference_mode``;
    ``leading_update``: a prefill's by-position KV write (``(buffer, rows) -> buffer``; None: ``slice_scatter``)."""

    name: str
    kv_write: KVWrite
    fixed_batch: bool
    inference_mode: bool
    leading_update: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int]) -> Runnable: ...


@runtime_checkable
class ArtifactGraphs(Protocol):
    """Loads a rank's compiled graphs from an artifact directory, by file name, with the host tables
    (``host:`` tensors) a graph may read."""

    name: str
    kv_write: KVWrite

    def load_graphs(self, rank_dir: Path, files: Sequence[str], host: Mapping[str, torch.Tensor]) -> dict[str, Runnable]: ...


@runtime_checkable
class GraphSaver(ArtifactGraphs, Protocol):
    """Also saves them: ``graphs`` ({file name: runnable}) into ``rank_dir``, the rank's weights once for all of
    them (``named``: {name: tensor} of the pooled tensors); returns the files written."""

    def save_graphs(self, graphs: Mapping[str, Runnable], rank_dir: Path, named: Mapping[str, torch.Tensor]) -> list[Path]: ...


__all__ = ["GraphCompiler", "ArtifactGraphs", "GraphSaver"]
