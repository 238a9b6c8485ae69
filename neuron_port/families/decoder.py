"""The common shape of a Hugging Face decoder-only CausalLM, as one adapter base class.

Most decoder families in ``transformers`` share one module tree: ``model.model.layers[i]``
with ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``, ``model.model.embed_tokens``,
an ``lm_head`` (tied or not), and a config with ``num_attention_heads`` /
``num_key_value_heads`` / ``head_dim``. :class:`DecoderFamily` answers every question the library
asks in those terms; a family adapter subclasses it and overrides only where its model
differs (Gemma-4 overrides a lot; Llama and Qwen3 almost nothing).

Outside ``neuron_port.families`` no module names a Hugging Face attribute: projections are
reached by *role* (``"q"``, ``"k"``, ``"v"``, ``"o"`` for attention; ``"gate"``, ``"up"``,
``"down"`` for the MLP), checkpoint keys come from the ``*_key`` methods, and config facts
from the per-layer readers below.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from neuron_port.errors import AdapterError, UnsupportedArchitectureError
from neuron_port.families.parts import (
    MLP_ROLES,
    TINY_HEAD_DIM,
    TINY_HIDDEN,
    TINY_INITIALIZER_RANGE,
    TINY_INTERMEDIATE,
    TINY_SPECIAL_IDS,
    TINY_VOCAB,
    RoleView,
    SpecialIds,
)


class DecoderFamily:
    """Adapter for the common Hugging Face decoder layout. Subclasses set the class attributes."""

    name: str = "decoder"
    model_types: tuple[str, ...] = ()
    text_types: tuple[str, ...] = ()
    # model_type -> (module path, class name) for the config and the CausalLM
    config_classes: dict[str, tuple[str, str]] = {}
    causal_lm_classes: dict[str, tuple[str, str]] = {}

    _ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
    _MLP = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}

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

    # ---- modules of a model instance --------------------------------------------------------
    def text_config_of(self, model: nn.Module) -> Any:
        config = model.config
        return getattr(config, "text_config", None) or config

    def text_model(self, model: nn.Module) -> nn.Module:
        """The decoder stack inside a CausalLM."""
        return getattr(model, "model", model)

    def decoder_layers(self, model: nn.Module) -> list[nn.Module]:
        return list(self.text_model(model).layers[: self.num_layers(self.text_config_of(model))])

    def attention(self, layer: nn.Module) -> nn.Module:
        return layer.self_attn

    def mlp(self, layer: nn.Module) -> nn.Module:
        return layer.mlp

    # Fused projections (one module for several roles) cannot be split into even SPMD slices per role.
    fused_projections: bool = False

    def attention_projections(self, attn: nn.Module) -> dict[str, nn.Module | RoleView | None]:
        """Role -> projection module, or a :class:`RoleView` of a fused one (None where the layer has
        no such projection). Readers use ``.weight`` and ``.bias`` only."""
        return {role: getattr(attn, attr, None) for role, attr in self._ATTN.items()}

    def set_attention_projection(self, attn: nn.Module, role: str, module: nn.Module) -> None:
        setattr(attn, self._ATTN[role], module)

    def set_attention_projections(self, attn: nn.Module, modules: dict[str, nn.Module]) -> None:
        """Install a rank's projections, every role of the layer at once (q, its k and v, o).

        Called once per layer, after which the module must compute with the local head counts the
        new shapes imply. The default sets one attribute per role; a fused family re-fuses here
        and updates whatever its forward reads (Phi-3: its config copy's head counts)."""
        for role, module in modules.items():
            self.set_attention_projection(attn, role, module)

    def mlp_projections(self, mlp: nn.Module) -> dict[str, nn.Module | RoleView]:
        return {role: getattr(mlp, attr) for role, attr in self._MLP.items()}

    def set_mlp_projection(self, mlp: nn.Module, role: str, module: nn.Module) -> None:
        setattr(mlp, self._MLP[role], module)

    def set_mlp_projections(self, mlp: nn.Module, modules: dict[str, nn.Module]) -> None:
        """Install a rank's MLP projections (gate, up, down) at once; see :meth:`set_attention_projections`."""
        for role, module in modules.items():
            self.set_mlp_projection(mlp, role, module)

    def use_attention(self, model: nn.Module, implementation: str) -> None:
        """Make every attention module of ``model`` call ``implementation``: the model's config, its
        text part, and any config copy a module holds of its own (a fused family's per-layer copy
        made when sharding keeps whatever it was copied from otherwise)."""
        self.set_attention_implementation(model.config, implementation)
        for module in model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation"):
                config._attn_implementation = implementation

    def layer_projections(self, layer: nn.Module, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(attention projections, MLP projections) of decoder layer ``index``, checked: what every
        reader outside the adapter uses, so an adapter whose hooks miss the model's modules fails
        with an :class:`AdapterError` naming the hook, not an ``AttributeError`` deep inside."""
        try:
            attn_proj = self.attention_projections(self.attention(layer))
            mlp_proj = self.mlp_projections(self.mlp(layer))
        except (AttributeError, KeyError, TypeError) as exc:
            raise self.hook_error(exc, f"on layer {index} of a {type(layer).__name__}") from None
        for hook, found, required in (("attention_projections", attn_proj, ("q", "o")),
                                      ("mlp_projections", mlp_proj, MLP_ROLES)):
            for role in required:
                if getattr(found.get(role), "weight", None) is None:
                    raise AdapterError(f"the {self.name} adapter's {hook}() gave no {role!r} projection with a weight "
                                       f"for layer {index} (found {type(found.get(role)).__name__}); it must map each "
                                       f"role to the module (or a RoleView of a fused one) of that layer")
        return attn_proj, mlp_proj

    def hook_error(self, exc: BaseException, where: str = "on this model") -> AdapterError:
        """An :class:`AdapterError` naming the adapter hook (the innermost frame that is a method of
        this adapter) where ``exc``, an ``AttributeError`` or the like, was raised."""
        import traceback

        frames = traceback.extract_tb(exc.__traceback__)
        hook = next((f.name for f in reversed(frames)
                     if not f.name.startswith("__") and callable(getattr(type(self), f.name, None))), None)
        name = f"{hook}() hook" if hook else "hooks"
        return AdapterError(f"the {self.name} adapter's {name} failed {where}: {type(exc).__name__}: {exc}; "
                            f"override {hook or 'the hook'} for it")

    def attention_implementation(self, attn: nn.Module) -> str | None:
        """The attention implementation an attention module's config names (None: it holds no config).
        A hint only: the self-check's sentinel says what really runs."""
        return getattr(getattr(attn, "config", None), "_attn_implementation", None)

    def set_kv_groups(self, attn: nn.Module, groups: int) -> None:
        """How many query heads share each local KV head (Hugging Face's repeat count)."""
        attn.num_key_value_groups = groups

    def word_embedding(self, model: nn.Module) -> nn.Embedding:
        return self.text_model(model).embed_tokens

    def per_layer_embedding(self, model: nn.Module) -> nn.Embedding | None:
        return None

    def head_module(self, model: nn.Module) -> nn.Module | None:
        """The CausalLM's head module (tied or not), or None for a model without one."""
        return getattr(model, "lm_head", None)

    def lm_head_weight(self, model: nn.Module) -> torch.Tensor:
        """[vocab, hidden]: the graphs end at ``hidden @ lm_head_weight.T`` (raw logits). A family
        whose forward scales the logits after the head (Granite divides by ``logits_scaling``)
        folds that scale in here; a softcap goes in :meth:`softcap` (applied on the host)."""
        head = self.head_module(model)
        return head.weight if head is not None else self.word_embedding(model).weight

    def attention_mask_argument(self, masks: dict[str, torch.Tensor]) -> Any:
        """What the text model's ``attention_mask`` gets, from the graph's additive masks keyed
        ``"full"`` and ``"sliding"`` ([batch, 1, q_len, kv_len] each).

        The default is the mask mapping by layer type that Gemma-4, Qwen3 and most recent
        families accept as pre-built masks. A family whose text model takes one 4-D tensor
        must override this: given a dict it would build no mask at all and silently attend
        everything."""
        return {"full_attention": masks["full"], "sliding_attention": masks["sliding"]}

    def text_model_extra_inputs(self, per_layer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Extra keyword inputs of the text model (Gemma-4's per-layer inputs); none by default."""
        return {}

    def reinit_nonpersistent(self, model: nn.Module, config: Any) -> None:
        """After the model's own ``_init_weights`` (:func:`neuron_port.model.loading.init_nonpersistent_buffers`),
        finish never-saved buffers; the default rebuilds the RoPE module from the config."""
        text = self.text_model(model)
        if hasattr(text, "rotary_emb"):
            text.rotary_emb = type(text.rotary_emb)(config)

    # ---- chat format ----------------------------------------------------------------------------
    # Token strings that end an assistant turn (resolved to ids through the model's tokenizer).
    chat_stop_tokens: tuple[str, ...] = ()

    def chat_prompt(self, messages: list[dict[str, str]]) -> str | None:
        """The family's own chat format, for tokenizer files that carry no ``chat_template``:
        ``messages`` (``role``, ``content``) rendered up to the assistant's turn, without BOS.
        None when the family has no default format."""
        return None

    # ---- per-layer buffers --------------------------------------------------------------------
    def layer_buffer_names(self) -> tuple[str, ...]:
        """Per-layer persistent buffers whose loss silently breaks the model (none by default)."""
        return ()

    def buffer_defaults(self) -> dict[str, float]:
        """Value a fresh module gives each of :meth:`layer_buffer_names` (what a params-only load leaves)."""
        return {}

    def seed_layer_buffers(self, model: nn.Module, generator: torch.Generator) -> None:
        """Give random-weight models non-default buffer values (so a reset is visible)."""

    # ---- checkpoints --------------------------------------------------------------------------
    def normalize_key(self, key: str) -> str | None:
        """A checkpoint key as the text CausalLM names it; None for tensors it does not use."""
        return key

    def word_embedding_key(self) -> str:
        return "model.embed_tokens.weight"

    def per_layer_embedding_key(self) -> str | None:
        return None

    def lm_head_key(self) -> str:
        return "lm_head.weight"

    def projection_key(self, index: int, role: str) -> str:
        """Checkpoint key of layer ``index``'s attention projection weight for ``role``."""
        return f"model.layers.{index}.self_attn.{self._ATTN[role]}.weight"

    def layer_buffer_key(self, index: int, name: str) -> str:
        return f"model.layers.{index}.{name}"


__all__ = ["DecoderFamily"]
