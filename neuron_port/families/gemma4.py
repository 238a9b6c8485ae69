"""Adapter for the Gemma-4 text families (``gemma4_text`` and ``gemma4_unified_text``).

This module is the one place that spells Hugging Face attribute names: where the text model
sits inside the CausalLM and ConditionalGeneration wrappers, what the attention and MLP
projections are called, how KV sharing is declared in the config, and how checkpoint keys of
the multimodal wrappers map onto the text-only CausalLM. Everything else in the library asks
this adapter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from neuron_port.errors import UnsupportedArchitectureError

TEXT_TYPES = ("gemma4_text", "gemma4_unified_text")
WRAPPER_TYPES = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text"}

# Checkpoint key prefixes of the multimodal wrappers, rewritten to the CausalLM's own.
_KEY_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.", "model."),
)


class Gemma4Family:
    """What the library needs to know about Gemma-4 text models, by name."""

    name = "gemma4"
    model_types = TEXT_TYPES + tuple(WRAPPER_TYPES)

    # ---- configs -------------------------------------------------------------------------
    def text_config_dict(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The text part of a config dict: itself, or its ``text_config`` for a wrapper."""
        model_type = raw.get("model_type")
        if model_type in WRAPPER_TYPES:
            text = dict(raw.get("text_config") or {})
            text.setdefault("model_type", WRAPPER_TYPES[model_type])
            return text
        if model_type in TEXT_TYPES:
            return dict(raw)
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type}; supported: {', '.join(sorted(self.model_types))}"
        )

    def config_class(self, model_type: str) -> type:
        if model_type == "gemma4_text":
            from transformers import Gemma4TextConfig

            return Gemma4TextConfig
        if model_type == "gemma4_unified_text":
            from transformers.models.gemma4_unified.configuration_gemma4_unified import (
                Gemma4UnifiedTextConfig,
            )

            return Gemma4UnifiedTextConfig
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type}; supported: {', '.join(TEXT_TYPES)}"
        )

    def causal_lm_class(self, model_type: str) -> type:
        if model_type == "gemma4_text":
            from transformers import Gemma4ForCausalLM

            return Gemma4ForCausalLM
        if model_type == "gemma4_unified_text":
            from transformers.models.gemma4_unified.modeling_gemma4_unified import (
                Gemma4UnifiedForCausalLM,
            )

            return Gemma4UnifiedForCausalLM
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type}; supported: {', '.join(TEXT_TYPES)}"
        )

    def make_config(self, text_dict: dict[str, Any]) -> Any:
        """A Hugging Face text config object from a text config dict."""
        fields = {k: v for k, v in text_dict.items() if k not in ("model_type", "architectures")}
        cls = self.config_class(text_dict["model_type"])
        if text_dict["model_type"] == "gemma4_unified_text":
            fields.pop("hidden_size_per_layer_input", None)
            fields.pop("vocab_size_per_layer_input", None)
        return cls(**fields)

    # ---- per-layer facts from a config ----------------------------------------------------
    def layer_types(self, config: Any) -> list[str]:
        return list(config.layer_types)

    def is_full(self, config: Any, index: int) -> bool:
        return config.layer_types[index] == "full_attention"

    def head_dim(self, config: Any, index: int) -> int:
        return int(config.per_layer_config[index].head_dim)

    def n_kv(self, config: Any, index: int) -> int:
        return int(config.per_layer_config[index].num_key_value_heads)

    def k_eq_v(self, config: Any, index: int) -> bool:
        return bool(getattr(config, "attention_k_eq_v", False)) and self.is_full(config, index)

    def per_layer_input_size(self, config: Any) -> int:
        return int(getattr(config, "hidden_size_per_layer_input", 0) or 0)

    def intermediate_size(self, config: Any, index: int) -> int:
        wide = bool(getattr(config, "use_double_wide_mlp", False)) and self.is_kv_shared(config, index)
        return int(config.intermediate_size) * (2 if wide else 1)

    def is_kv_shared(self, config: Any, index: int) -> bool:
        return config.kv_sharing_modes[index] == "reuse"

    def kv_source(self, config: Any, index: int) -> int:
        """The layer whose K/V layer ``index`` attends: itself for an owner.

        A shared layer reads the last non-shared layer of its own attention type.
        """
        if not self.is_kv_shared(config, index):
            return index
        first_shared = config.num_hidden_layers - config.num_kv_shared_layers
        own_type = config.layer_types[index]
        for j in range(first_shared - 1, -1, -1):
            if config.layer_types[j] == own_type:
                return j
        raise ValueError(f"layer {index} ({own_type}) is shared but no earlier layer of its type owns KV")

    def softcap(self, config: Any) -> float | None:
        value = getattr(config, "final_logit_softcapping", None)
        return float(value) if value else None

    # ---- modules of a model instance --------------------------------------------------------
    def text_model(self, model: nn.Module) -> nn.Module:
        """The decoder stack (``Gemma4TextModel``) inside a CausalLM or ConditionalGeneration."""
        inner = getattr(model, "model", model)
        return getattr(inner, "language_model", inner)

    def text_config_of(self, model: nn.Module) -> Any:
        config = model.config
        return getattr(config, "text_config", None) or config

    def decoder_layers(self, model: nn.Module) -> list[nn.Module]:
        text = self.text_model(model)
        return list(text.layers[: self.text_config_of(model).num_hidden_layers])

    def attention(self, layer: nn.Module) -> nn.Module:
        return layer.self_attn

    def mlp(self, layer: nn.Module) -> nn.Module:
        return layer.mlp

    def word_embedding(self, model: nn.Module) -> nn.Embedding:
        return self.text_model(model).embed_tokens

    def per_layer_embedding(self, model: nn.Module) -> nn.Embedding | None:
        return getattr(self.text_model(model), "embed_tokens_per_layer", None)

    def lm_head_weight(self, model: nn.Module) -> torch.Tensor:
        head = getattr(model, "lm_head", None)
        return head.weight if head is not None else self.word_embedding(model).weight

    def layer_scalar_name(self) -> str:
        return "layer_scalar"

    # ---- checkpoints --------------------------------------------------------------------------
    def normalize_key(self, key: str) -> str | None:
        """A checkpoint key as the text CausalLM names it; None for non-text tensors."""
        for old, new in _KEY_PREFIXES:
            if key.startswith(old):
                return new + key[len(old):]
        if key.startswith(("model.vision", "model.audio", "model.embed_vision", "model.embed_audio",
                           "vision_tower.", "audio_tower.", "multi_modal_projector.", "embed_vision.",
                           "embed_audio.")):
            return None
        return key

    def word_embedding_key(self) -> str:
        return "model.embed_tokens.weight"

    def per_layer_embedding_key(self) -> str:
        return "model.embed_tokens_per_layer.weight"


GEMMA4 = Gemma4Family()
