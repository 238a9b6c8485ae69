"""The quantization enums the library names, as neuronx-distributed 2.28.0 defines their values (int8 only here)."""

from __future__ import annotations

from enum import Enum

import torch


class QuantizationType(Enum):
    PER_TENSOR_SYMMETRIC = "per_tensor_symmetric"
    PER_CHANNEL_SYMMETRIC = "per_channel_symmetric"


class QuantizedDtype(Enum):
    INT8 = torch.int8
