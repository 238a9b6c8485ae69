"""Adapter for Llama (``LlamaForCausalLM``): plain GQA, every layer full attention, no KV sharing.

Llama is the common decoder shape itself, so the adapter only names its classes and its
tiny variant. It is the reuse proof's baseline: if a primitive needed a Llama special case,
that special case would belong in the Gemma adapter instead.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_port.families.decoder import (
    TINY_HEAD_DIM,
    TINY_HIDDEN,
    TINY_INITIALIZER_RANGE,
    TINY_INTERMEDIATE,
    TINY_SPECIAL_IDS,
    TINY_VOCAB,
    DecoderFamily,
)

TINY_LAYERS = 4
TINY_Q_HEADS = 8
TINY_KV_HEADS = 2  # 4 query heads per KV head, as in Llama-3.2-1B (32/8); fewer than tp 4


class LlamaFamily(DecoderFamily):
    name = "llama"
    text_types = ("llama",)
    model_types = ("llama",)
    config_classes = {"llama": ("transformers", "LlamaConfig")}
    causal_lm_classes = {"llama": ("transformers", "LlamaForCausalLM")}

    def attention_mask_argument(self, masks: dict[str, torch.Tensor]) -> Any:
        """``LlamaModel`` takes one 4-D mask (used as is); every layer is full attention."""
        return masks["full"]

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """4 layers, 8 q / 2 kv heads of 16, hidden 64; RoPE scaling and tying kept."""
        tiny = dict(text)
        tiny.update(
            vocab_size=TINY_VOCAB,
            hidden_size=TINY_HIDDEN,
            intermediate_size=TINY_INTERMEDIATE,
            num_hidden_layers=TINY_LAYERS,
            num_attention_heads=TINY_Q_HEADS,
            num_key_value_heads=TINY_KV_HEADS,
            head_dim=TINY_HEAD_DIM,
            max_position_embeddings=16384,  # above the RoPE scaling's original 8192
            initializer_range=TINY_INITIALIZER_RANGE,
            **TINY_SPECIAL_IDS,
        )
        return tiny


LLAMA = LlamaFamily()
