"""Tensor-parallel linears at tp 1, where they are plain linears (the stand-in runs one rank)."""

from __future__ import annotations

import torch
from torch import nn


class ColumnParallelLinear(nn.Linear):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = True,
                 dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__(input_size, output_size, bias=bias, dtype=dtype)


class RowParallelLinear(nn.Linear):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, input_is_parallel: bool = False,
                 dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__(input_size, output_size, bias=bias, dtype=dtype)
