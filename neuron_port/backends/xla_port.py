"""A port whose graphs run through torch-xla: one device at tp 1, SPMD over tp devices above.

The same setup (shard plan) as every other path: at tp 1 the rank's graphs go to the XLA device;
at tp > 1 the model is laid out so that device r's even slice of every weight and of the KV
store is rank r's shard (:mod:`neuron_port.backends.spmd`), and XLA's partitioner writes the all-reduce.
The backend's :meth:`~neuron_port.backends.xla.XlaBackend.report` tells how the graphs lowered.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from neuron_port.backends.spmd import spmd_model
from neuron_port.backends.xla import XlaBackend
from neuron_port.graph.kv import KVWrite
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.parallel.ranks import RankSetup, run_ranks


def xla_port(model: nn.Module, setup: RankSetup, shape: PortShape, batch: int = 1,
             kv_write: KVWrite = KVWrite.ROWS, prefill_update: bool = True,
             decode_rows: Sequence[int] | None = None) -> tuple[Port, XlaBackend]:
    """The port of ``model`` under ``setup``, compiled for ``batch`` rows by the XLA backend (``model`` is not
    modified), every graph over the one store at the largest KV length, which stays aliased on the device (no
    store is viewed or copied between lengths: :func:`~neuron_port.graph.graphs.build_graphs`); ``kv_write``,
    ``prefill_update``: see :class:`XlaBackend`; ``decode_rows``: see :meth:`~neuron_port.graph.port.Port.compile`
    (a graph over fewer rows takes the whole store and reads and writes its first rows)."""
    backend = XlaBackend(setup, kv_write, prefill_update)  # fails fast, with the install hint, without torch-xla
    if setup.tp == 1:
        port = run_ranks(lambda rank: Port.for_rank(rank, shape, one_store=True), setup, model)[0]
    else:
        spread, kv_heads = spmd_model(model, setup)
        port = Port.over_model(spread, shape, setup.layout, kv_heads, owned=True, one_store=True)  # a copy already
    port.compile(backend, batch, decode_rows=decode_rows)
    return port, backend


__all__ = ["xla_port"]
