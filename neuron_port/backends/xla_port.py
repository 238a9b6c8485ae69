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
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.parallel.ranks import RankSetup, run_ranks


def xla_port(model: nn.Module, setup: RankSetup, shape: PortShape, batch: int = 1,
             row_kv_writes: bool = True, prefill_update: bool = True,
             decode_rows: Sequence[int] | None = None) -> tuple[Port, XlaBackend]:
    """The port of ``model`` under ``setup``, compiled for ``batch`` rows by the XLA backend (``model`` is not
    modified; ``row_kv_writes``, ``prefill_update``: see :class:`XlaBackend`; ``decode_rows``: see
    :meth:`~neuron_port.graph.port.Port.compile`)."""
    backend = XlaBackend(setup, row_kv_writes, prefill_update)  # fails fast, with the install hint, without torch-xla
    if setup.tp == 1:
        port = run_ranks(lambda rank: Port.for_rank(rank, shape), setup, model)[0]
    else:
        spread, kv_heads = spmd_model(model, setup)
        port = Port.over_model(spread, shape, setup.layout, kv_heads, owned=True)  # spmd_model made it a copy
    port.compile(backend, batch, decode_rows=decode_rows)
    return port, backend


__all__ = ["xla_port"]
