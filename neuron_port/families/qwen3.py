"""Adapter for Qwen3 (``Qwen3ForCausalLM``): GQA with per-head RMSNorm on queries and keys.

The q/k norms act on ``head_dim`` inside each head, so head-wise sharding leaves them whole
(every rank keeps the full norm weights); nothing else differs from the common decoder shape.
Qwen3 can declare sliding-window layers (``use_sliding_window``); the shipped checkpoints do
not, and the adapter reads whatever ``layer_types`` the config has.
"""

from __future__ import annotations

from typing import Any

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
TINY_Q_HEADS = 4
TINY_KV_HEADS = 2  # 2 query heads per KV head, as in Qwen3-0.6B (16/8); fewer than tp 4


class Qwen3Family(DecoderFamily):
    name = "qwen3"
    text_types = ("qwen3",)
    model_types = ("qwen3",)
    config_classes = {"qwen3": ("transformers", "Qwen3Config")}
    causal_lm_classes = {"qwen3": ("transformers", "Qwen3ForCausalLM")}

    def sliding_window(self, config: Any) -> int | None:
        if not getattr(config, "use_sliding_window", False):
            return None
        return super().sliding_window(config)

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """4 layers, 4 q / 2 kv heads of 16 (with q/k norms), hidden 64."""
        tiny = dict(text)
        tiny.update(
            vocab_size=TINY_VOCAB,
            hidden_size=TINY_HIDDEN,
            intermediate_size=TINY_INTERMEDIATE,
            num_hidden_layers=TINY_LAYERS,
            num_attention_heads=TINY_Q_HEADS,
            num_key_value_heads=TINY_KV_HEADS,
            head_dim=TINY_HEAD_DIM,
            max_window_layers=TINY_LAYERS,
            max_position_embeddings=4096,
            initializer_range=TINY_INITIALIZER_RANGE,
            **TINY_SPECIAL_IDS,
        )
        tiny.pop("layer_types", None)  # recomputed by the config from the new layer count
        return tiny


QWEN3 = Qwen3Family()
