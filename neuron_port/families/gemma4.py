"""Adapter for the Gemma-4 text families (``gemma4_text`` and ``gemma4_unified_text``).

Gemma-4 departs from the common decoder shape (:class:`~neuron_port.families.decoder.DecoderFamily`)
in ways that each broke a hand-made port: the text model sits inside multimodal wrappers, head
counts and head sizes differ per attention type (``per_layer_config``), the last layers read
another layer's KV cache, full layers may use one projection for K and V, embeddings are scaled
and joined by per-layer embeddings (PLE), every layer carries a ``layer_scalar`` buffer, and the
logits are soft-capped. All of that is spelled here and nowhere else.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from neuron_port.errors import ConfigError
from neuron_port.families.decoder import DecoderFamily
from neuron_port.families.parts import (
    TINY_HEAD_DIM,
    TINY_HIDDEN,
    TINY_INITIALIZER_RANGE,
    TINY_INTERMEDIATE,
    TINY_PER_LAYER_INPUT,
    TINY_VOCAB,
)

TEXT_TYPES = ("gemma4_text", "gemma4_unified_text")
WRAPPER_TYPES = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text"}

# Checkpoint key prefixes of the multimodal wrappers, rewritten to the CausalLM's own.
_KEY_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.", "model."),
)
_NON_TEXT_PREFIXES = ("model.vision", "model.audio", "model.embed_vision", "model.embed_audio", "vision_tower.",
                      "audio_tower.", "multi_modal_projector.", "embed_vision.", "embed_audio.")
_UNIFIED = "transformers.models.gemma4_unified"


GEMMA_CHAT_STOP_TOKENS = ("<end_of_turn>",)


def gemma_chat_prompt(messages: list[dict[str, str]]) -> str:
    """Gemma's turn format: ``<start_of_turn>user`` / ``<start_of_turn>model`` turns closed by
    ``<end_of_turn>``; system content is prepended to the first user turn (Gemma has no system
    role); the model's turn opened last."""
    system = " ".join(m["content"] for m in messages if m["role"] == "system")
    parts = []
    for m in messages:
        if m["role"] == "system":
            continue
        role = "model" if m["role"] == "assistant" else "user"
        content = m["content"]
        if system and role == "user":
            content, system = f"{system}\n\n{content}", ""
        parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
    return "".join(parts) + "<start_of_turn>model\n"


class Gemma4Family(DecoderFamily):
    """What the library needs to know about Gemma-4 text models, by name."""

    name = "gemma4"
    text_types = TEXT_TYPES
    model_types = TEXT_TYPES + tuple(WRAPPER_TYPES)
    config_classes = {
        "gemma4_text": ("transformers", "Gemma4TextConfig"),
        "gemma4_unified_text": (f"{_UNIFIED}.configuration_gemma4_unified", "Gemma4UnifiedTextConfig"),
    }
    causal_lm_classes = {
        "gemma4_text": ("transformers", "Gemma4ForCausalLM"),
        "gemma4_unified_text": (f"{_UNIFIED}.modeling_gemma4_unified", "Gemma4UnifiedForCausalLM"),
    }

    # ---- configs -------------------------------------------------------------------------
    def text_config_dict(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The text part of a config dict: itself, or its ``text_config`` for a wrapper."""
        model_type = raw.get("model_type")
        if model_type in WRAPPER_TYPES:
            text = dict(raw.get("text_config") or {})
            text.setdefault("model_type", WRAPPER_TYPES[model_type])
            return text
        return super().text_config_dict(raw)

    def make_config(self, text_dict: dict[str, Any]) -> Any:
        fields = dict(text_dict)
        if text_dict["model_type"] == "gemma4_unified_text":
            fields.pop("hidden_size_per_layer_input", None)
            fields.pop("vocab_size_per_layer_input", None)
        return super().make_config(fields)

    def config_to_dict(self, config: Any) -> dict[str, Any]:
        data = super().config_to_dict(config)
        data.pop("per_layer_config", None)
        per_layer = config.per_layer_config
        full = [i for i, t in enumerate(config.layer_types) if t == "full_attention"]
        if full:
            data["global_head_dim"] = int(per_layer[full[0]].head_dim)
            if getattr(config, "attention_k_eq_v", False):
                data["num_global_key_value_heads"] = int(per_layer[full[0]].num_key_value_heads)
        return data

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """Shrink a real text config, keeping every architectural feature.

        Kept: the layer-type pattern rule (full every ``period`` layers), KV sharing with both a
        sliding and a full shared layer, the real q/kv head counts (and the global KV-head count
        with ``attention_k_eq_v``), global head_dim = 2 x head_dim, per-layer embeddings and the
        double-wide MLP where present, the softcap and tied embeddings. The sliding window shrinks
        to 8 (or 16 for a 1024 window) so that short tests cross it.
        """
        types = list(text["layer_types"])
        period = types.index("full_attention") + 1
        for i, t in enumerate(types):
            if (t == "full_attention") != (i % period == period - 1):
                raise ConfigError(f"layer types do not follow one period-{period} rule at layer {i}")
        n_layers = 2 * period
        tiny = dict(text)
        tiny.update(
            vocab_size=TINY_VOCAB,
            hidden_size=TINY_HIDDEN,
            intermediate_size=TINY_INTERMEDIATE,
            num_hidden_layers=n_layers,
            head_dim=TINY_HEAD_DIM,
            global_head_dim=2 * TINY_HEAD_DIM,
            layer_types=["full_attention" if i % period == period - 1 else "sliding_attention" for i in range(n_layers)],
            sliding_window=16 if int(text["sliding_window"]) >= 1024 else 8,
            num_kv_shared_layers=(period - 1) if int(text.get("num_kv_shared_layers", 0)) else 0,
            max_position_embeddings=4096,
            initializer_range=TINY_INITIALIZER_RANGE,
        )
        if int(text.get("hidden_size_per_layer_input", 0) or 0):
            tiny.update(hidden_size_per_layer_input=TINY_PER_LAYER_INPUT, vocab_size_per_layer_input=TINY_VOCAB)
        return tiny

    # ---- per-layer facts from a config ----------------------------------------------------
    def layer_types(self, config: Any) -> list[str]:
        return list(config.layer_types)

    def head_dim(self, config: Any, index: int) -> int:
        return int(config.per_layer_config[index].head_dim)

    def n_kv(self, config: Any, index: int) -> int:
        return int(config.per_layer_config[index].num_key_value_heads)

    def sliding_window(self, config: Any) -> int | None:
        return int(config.sliding_window)

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

    def embedding_scales(self, config: Any) -> tuple[float | None, float | None]:
        """Gemma scales word rows by sqrt(hidden) and per-layer rows by sqrt(per_layer)."""
        per_layer = self.per_layer_input_size(config)
        return float(config.hidden_size) ** 0.5, (float(per_layer) ** 0.5 if per_layer else None)

    # ---- modules of a model instance --------------------------------------------------------
    def text_model(self, model: nn.Module) -> nn.Module:
        """The decoder stack (``Gemma4TextModel``) inside a CausalLM or ConditionalGeneration."""
        inner = getattr(model, "model", model)
        return getattr(inner, "language_model", inner)

    def per_layer_embedding(self, model: nn.Module) -> nn.Embedding | None:
        return getattr(self.text_model(model), "embed_tokens_per_layer", None)

    def text_model_extra_inputs(self, per_layer: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"per_layer_inputs": per_layer}

    # ---- chat format ----------------------------------------------------------------------------
    chat_stop_tokens = GEMMA_CHAT_STOP_TOKENS

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return gemma_chat_prompt(messages)

    def layer_buffer_names(self) -> tuple[str, ...]:
        return ("layer_scalar",)

    def buffer_defaults(self) -> dict[str, float]:
        return {"layer_scalar": 1.0}

    def seed_layer_buffers(self, model: nn.Module, generator: torch.Generator) -> None:
        """``layer_scalar`` gets values in [0.5, 1.0) instead of the default 1.0."""
        with torch.no_grad():
            for layer in self.decoder_layers(model):
                scalar = layer.layer_scalar
                scalar.copy_(0.5 + 0.5 * torch.rand(scalar.shape, generator=generator))

    # ---- checkpoints --------------------------------------------------------------------------
    def normalize_key(self, key: str) -> str | None:
        """A checkpoint key as the text CausalLM names it; None for non-text tensors."""
        for old, new in _KEY_PREFIXES:
            if key.startswith(old):
                return new + key[len(old):]
        if key.startswith(_NON_TEXT_PREFIXES):
            return None
        return key

    def per_layer_embedding_key(self) -> str | None:
        return "model.embed_tokens_per_layer.weight"


GEMMA4 = Gemma4Family()
