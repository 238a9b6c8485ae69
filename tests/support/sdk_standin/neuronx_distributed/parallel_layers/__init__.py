"""Stand-in of NxD's tensor-parallel linears (``layers.py``), sized for the world ModelBuilder traces at."""

from __future__ import annotations

from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]
