"""What a decoder family reads from a Hugging Face config: one of the three parts of
:class:`~neuron_port.families.decoder.DecoderFamily`.

The config and CausalLM classes of each model type, a config built, written and shrunk to its tiny variant,
and the per-layer facts every plan starts from (heads, head sizes, attention kinds, KV sharing, special ids).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from neuron_port.errors import AdapterError, UnsupportedArchitectureError
from neuron_port.families.parts import (
    TINY_HEAD_DIM,
    TINY_HIDDEN,
    TINY_INITIALIZER_RANGE,
    TINY_INTERMEDIATE,
    TINY_SPECIAL_IDS,
    TINY_VOCAB,
    SpecialIds,
)


class ConfigFacts:
    """The config questions of a family adapter; subclasses set the class attributes."""

    name: str = "decoder"
    model_types: tuple[str, ...] = ()
    text_types: tuple[str, ...] = ()
    # model_type -> (module path, class name) for the config and the CausalLM
    config_classes: dict[str, tuple[str, str]] = {}
    causal_lm_classes: dict[str, tuple[str, str]] = {}

    # ---- configs -------------------------------------------------------------------------
    def _unsupported(self, model_type: Any) -> UnsupportedArchitectureError:
        return UnsupportedArchitectureError(
            f"unsupported architecture {model_type}; supported: {', '.join(sorted(self.model_types))}"
        )

    def text_config_dict(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The text part of a config dict (the dict itself for a text-only family)."""
        if raw.get("model_type") not in self.text_types:
            raise self._unsupported(raw.get("model_type"))
        return dict(raw)

    @staticmethod
    def _import(path: tuple[str, str]) -> type:
        import importlib

        return getattr(importlib.import_module(path[0]), path[1])

    def _class_for(self, hook: str, table: dict[str, tuple[str, str]], model_type: str) -> type:
        if model_type not in table:
            if model_type in self.model_types:
                raise AdapterError(f"the {self.name} adapter names no class for model type {model_type!r}: add it to "
                                   f"its {hook} (model_type -> (module, class name))")
            raise self._unsupported(model_type)
        try:
            return self._import(table[model_type])
        except (ImportError, AttributeError) as exc:
            raise AdapterError(f"the {self.name} adapter's {hook}[{model_type!r}] = {table[model_type]} cannot be "
                               f"imported: {exc}") from None

    def config_class(self, model_type: str) -> type:
        return self._class_for("config_classes", self.config_classes, model_type)

    def causal_lm_class(self, model_type: str) -> type:
        return self._class_for("causal_lm_classes", self.causal_lm_classes, model_type)

    def make_config(self, text_dict: dict[str, Any]) -> Any:
        """A Hugging Face text config object from a text config dict."""
        fields = {k: v for k, v in text_dict.items() if k not in ("model_type", "architectures")}
        return self.config_class(text_dict["model_type"])(**fields)

    def config_to_dict(self, config: Any) -> dict[str, Any]:
        """A JSON-able text config dict that :meth:`make_config` reads back to the same config."""
        data = config.to_dict()
        data["model_type"] = config.model_type
        for key in ("transformers_version", "_name_or_path", "dtype", "architectures"):
            data.pop(key, None)
        return data

    # The tiny variant of the common shape: (query heads, KV heads), layer count, positions.
    tiny_heads: tuple[int, int] | None = None
    tiny_layers: int = 4
    tiny_max_positions: int = 4096

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """A shrunken text config with the family's architectural features.

        For the common shape: the shared tiny sizes, ``tiny_layers`` layers and ``tiny_heads``
        heads of the tiny head size, and the demo tokenizer's special ids; everything else (RoPE
        scaling, tying, norms) is kept. Families with more structure override this.
        """
        if self.tiny_heads is None:
            raise AdapterError(f"the {self.name} adapter has no tiny variant: set its tiny_heads (query heads, KV heads) "
                               "or override tiny_config_dict")
        q_heads, kv_heads = self.tiny_heads
        tiny = dict(text)
        tiny.update(
            vocab_size=TINY_VOCAB,
            hidden_size=TINY_HIDDEN,
            intermediate_size=TINY_INTERMEDIATE,
            num_hidden_layers=self.tiny_layers,
            num_attention_heads=q_heads,
            num_key_value_heads=kv_heads,
            head_dim=TINY_HEAD_DIM,
            max_position_embeddings=self.tiny_max_positions,
            initializer_range=TINY_INITIALIZER_RANGE,
            **TINY_SPECIAL_IDS,
        )
        tiny.pop("layer_types", None)  # recomputed by the config from the new layer count
        return tiny

    def set_attention_implementation(self, config: Any, implementation: str) -> None:
        """Force an attention implementation on a config (and on its text part)."""
        config._attn_implementation = implementation
        text = getattr(config, "text_config", None)
        if text is not None:
            text._attn_implementation = implementation

    # ---- facts from a text config ---------------------------------------------------------
    def num_layers(self, config: Any) -> int:
        return int(config.num_hidden_layers)

    def hidden_size(self, config: Any) -> int:
        return int(config.hidden_size)

    def vocab_size(self, config: Any) -> int:
        return int(config.vocab_size)

    def n_q(self, config: Any, index: int) -> int:
        return int(config.num_attention_heads)

    def n_kv(self, config: Any, index: int) -> int:
        return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)

    def head_dim(self, config: Any, index: int) -> int:
        value = getattr(config, "head_dim", None)
        return int(value) if value else int(config.hidden_size) // int(config.num_attention_heads)

    def layer_types(self, config: Any) -> list[str]:
        types = getattr(config, "layer_types", None)
        return list(types) if types else ["full_attention"] * self.num_layers(config)

    def is_full(self, config: Any, index: int) -> bool:
        return self.layer_types(config)[index] == "full_attention"

    def sliding_window(self, config: Any) -> int | None:
        """The sliding window of the model's sliding layers; None when it has none."""
        if all(self.is_full(config, i) for i in range(self.num_layers(config))):
            return None
        return int(config.sliding_window)

    def k_eq_v(self, config: Any, index: int) -> bool:
        return False

    def per_layer_input_size(self, config: Any) -> int:
        return 0

    def intermediate_size(self, config: Any, index: int) -> int:
        return int(config.intermediate_size)

    def is_kv_shared(self, config: Any, index: int) -> bool:
        return False

    def kv_source(self, config: Any, index: int) -> int:
        return index

    def softcap(self, config: Any) -> float | None:
        return None

    def tied_embeddings(self, config: Any) -> bool:
        """Whether the LM head is the word embedding matrix."""
        return bool(getattr(config, "tie_word_embeddings", True))

    def untie_embeddings(self, model: nn.Module) -> None:
        """Configs no longer tie the LM head to the word table (an int8 head is its own matrix)."""
        for config in {id(c): c for c in (getattr(model, "config", None), self.text_config_of(model)) if c is not None}.values():
            config.tie_word_embeddings = False

    def special_ids(self, config: Any) -> SpecialIds:
        eos = getattr(config, "eos_token_id", None)
        eos_ids = (eos,) if isinstance(eos, int) else tuple(int(e) for e in (eos or ()))
        bos = getattr(config, "bos_token_id", None)
        pad = getattr(config, "pad_token_id", None)
        return SpecialIds(int(bos) if bos is not None else None, eos_ids, int(pad) if pad is not None else None)

    def generation_eos_ids(self, generation_config: dict[str, Any]) -> tuple[int, ...]:
        """End-of-sequence ids of a ``generation_config.json`` dict (one id or a list; () when absent)."""
        eos = generation_config.get("eos_token_id")
        return (eos,) if isinstance(eos, int) else tuple(int(e) for e in eos) if isinstance(eos, list) else ()

    def generation_kwargs(self, config: Any, stop_ids: list[int]) -> dict[str, Any]:
        """Keyword arguments of Hugging Face ``generate`` for a greedy reference run that stops on
        ``stop_ids`` only (none: run to the token limit)."""
        pad = self.special_ids(config).pad
        return {"eos_token_id": list(stop_ids) or None, "pad_token_id": pad if pad is not None else 0}

    def embedding_scales(self, config: Any) -> tuple[float | None, float | None]:
        """Multipliers of the word and per-layer embedding rows (None: no scaling)."""
        return None, None


__all__ = ["ConfigFacts"]
