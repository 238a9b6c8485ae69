"""Tensor-parallel linears as NxD 2.28.0's ``parallel_layers/layers.py`` sizes and shards them.

Built for the world :mod:`parallel_state` gives (the rank-0 module of an SPMD graph):
``ColumnParallelLinear`` holds ``[out / tp, in]`` (its bias split with its rows) and, without
``gather_output``, returns its part of the output; ``RowParallelLinear`` holds ``[out, in / tp]``,
takes its part of the input (``input_is_parallel``), all-reduces, then adds its whole bias. The split
dimensions are recorded on the parameters, which is what ``shard_checkpoint`` cuts by. What the
library does not use at tp > 1 (gathering the output, scattering the input) is refused, not guessed.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from neuronx_distributed.parallel_layers.mappings import reduce_from_tensor_model_parallel_region
from neuronx_distributed.parallel_layers.parallel_state import (
    divide,
    get_tensor_model_parallel_size,
    set_tensor_model_parallel_attributes,
)


def column_split(output_size: int, gather_output: bool) -> int:
    """Rows per rank of a column-parallel layer (``gather_output`` is refused beyond one rank)."""
    world = get_tensor_model_parallel_size()
    if gather_output and world > 1:
        raise NotImplementedError("the stand-in does not gather a column-parallel output across ranks")
    return divide(output_size, world)


def row_split(input_size: int, input_is_parallel: bool) -> int:
    """Input columns per rank of a row-parallel layer (an input still to scatter is refused beyond one rank)."""
    world = get_tensor_model_parallel_size()
    if not input_is_parallel and world > 1:
        raise NotImplementedError("the stand-in does not scatter a row-parallel input across ranks")
    return divide(input_size, world)


def mark(tensor: torch.Tensor, dim: int | None) -> nn.Parameter:
    """``tensor`` as a frozen parameter with NxD's parallel attributes: split along ``dim``, or whole on every
    rank (None)."""
    param = nn.Parameter(tensor, requires_grad=False)
    set_tensor_model_parallel_attributes(param, dim is not None, 0 if dim is None else dim,
                                         num_partitions=get_tensor_model_parallel_size() if dim is not None else 1)
    return param


class ColumnParallelLinear(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = True,
                 dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__()
        local = column_split(output_size, gather_output)
        self.input_size, self.output_size = input_size, output_size
        self.weight = mark(torch.empty(local, input_size, dtype=dtype).normal_(std=0.02), 0)
        self.bias = mark(torch.zeros(local, dtype=dtype), 0) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, input_is_parallel: bool = False,
                 dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__()
        local = row_split(input_size, input_is_parallel)
        self.input_size, self.output_size = input_size, output_size
        self.weight = mark(torch.empty(output_size, local, dtype=dtype).normal_(std=0.02), 1)
        self.bias = mark(torch.zeros(output_size, dtype=dtype), None) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tensor_model_parallel_region(F.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y
