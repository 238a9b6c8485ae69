"""NxD's quantized parallel linears, as release 2.28.0 sizes, shards and computes them (see the stand-in's README).

What is kept of ``quantization/quantization_layers.py`` and ``dequantize.py``: the weight is an int8
*parameter* ``[out, in]``, the per-channel scale an fp32 parameter ``[out, 1]`` (the per-channel axis is
0), a bias a parameter in the layer's dtype added last; the forward casts the weight to the input's
dtype, multiplies, then scales the output in fp32 and casts it back. Only per-channel symmetric int8
with fp32 scales is offered: anything else is refused rather than guessed. Split across ranks as the float
layers are (:mod:`neuronx_distributed.parallel_layers.layers`); the scale is split with the weight's rows
where the per-channel axis is the partition axis (the column layer) and whole on every rank otherwise (the
row layer), as ``_setup_for_scale`` marks it; the row layer all-reduces after scaling, then adds its bias.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from neuronx_distributed.parallel_layers.layers import column_split, mark, row_split
from neuronx_distributed.parallel_layers.mappings import reduce_from_tensor_model_parallel_region
from neuronx_distributed.quantization.quantization_config import QuantizationType, QuantizedDtype


class _QuantizedLinear(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool, quantization_type, dtype: torch.dtype,
                 quantized_dtype, quantization_per_channel_axis: int | None, scale_dtype: torch.dtype,
                 local: tuple[int, int], partition_dim: int, bias_dim: int | None):
        super().__init__()
        if QuantizationType(quantization_type) != QuantizationType.PER_CHANNEL_SYMMETRIC:
            raise NotImplementedError(f"the stand-in offers per_channel_symmetric only, found {quantization_type}")
        if QuantizedDtype(quantized_dtype) != QuantizedDtype.INT8 or scale_dtype != torch.float32:
            raise NotImplementedError("the stand-in offers int8 weights with fp32 scales only")
        if quantization_per_channel_axis not in (None, 0):
            raise NotImplementedError("the stand-in offers per-channel axis 0 (output channels) only")
        self.input_size, self.output_size, self.dtype = input_size, output_size, dtype
        out, inner = local
        self.weight = mark(torch.zeros(out, inner, dtype=torch.int8), partition_dim)
        scale_dim = 0 if partition_dim == 0 else None  # split only where the per-channel axis is the partition axis
        self.scale = mark(torch.ones(out, 1, dtype=torch.float32), scale_dim)
        self.bias = mark(torch.zeros(out, dtype=dtype), bias_dim) if bias else None
        self.reduce = partition_dim == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight.to(x.dtype))
        y = (y.to(torch.float32) * self.scale.t()).to(y.dtype)  # dequantize.scale_dequantize's order
        if self.reduce:
            y = reduce_from_tensor_model_parallel_region(y)
        return y + self.bias if self.bias is not None else y


class QuantizedColumnParallel(_QuantizedLinear):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, quantization_type="per_tensor_symmetric",
                 gather_output: bool = True, dtype: torch.dtype = torch.float32, quantized_dtype=QuantizedDtype.INT8,
                 quantization_per_channel_axis: int | None = None, scale_dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__(input_size, output_size, bias, quantization_type, dtype, quantized_dtype,
                         quantization_per_channel_axis, scale_dtype, (column_split(output_size, gather_output), input_size),
                         0, 0)


class QuantizedRowParallel(_QuantizedLinear):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, quantization_type="per_tensor_symmetric",
                 input_is_parallel: bool = False, dtype: torch.dtype = torch.float32, quantized_dtype=QuantizedDtype.INT8,
                 quantization_per_channel_axis: int | None = None, scale_dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__(input_size, output_size, bias, quantization_type, dtype, quantized_dtype,
                         quantization_per_channel_axis, scale_dtype, (output_size, row_split(input_size, input_is_parallel)),
                         1, None)
