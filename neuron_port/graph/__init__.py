"""Layer ``graph``: one rank's static prefill and decode graphs.

The owners-only KV store (``kv``), the masks and maps the graphs build (``masks``), host
embeddings, the static attention function, prompt buckets and KV lengths (``shapes``), the inputs
of one step (``step``, ``host_inputs``, ``scratch``), the graphs over Hugging Face's forward
(``graphs``), the compile loop with save and load (``runners``), and
:class:`~neuron_port.graph.port.Port`, one rank's port.
"""

from __future__ import annotations

from neuron_port.graph.contracts import ArtifactGraphs, GraphCompiler, GraphSaver
from neuron_port.graph.graphs import GraphSet, build_graphs
from neuron_port.graph.kv import KVStore, KVStoreSpec, KVWrite
from neuron_port.graph.port import Port
from neuron_port.graph.runners import Runners, compile_graphs
from neuron_port.graph.shapes import PortShape, StoreShapes
from neuron_port.graph.step import StepInputs, run_step

__all__ = ["Port", "PortShape", "StoreShapes", "KVStore", "KVStoreSpec", "KVWrite", "GraphSet", "build_graphs", "Runners",
           "compile_graphs", "GraphCompiler", "ArtifactGraphs", "GraphSaver", "StepInputs", "run_step"]
