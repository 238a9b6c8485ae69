"""Where a decoder family's modules sit in a model instance: one of the three parts of
:class:`~neuron_port.families.decoder.DecoderFamily`.

The text model, its layers, attention and MLP, their projections by role (read and replaced), the
embeddings and head, the attention implementation, and what the text model's forward takes besides
the embeddings.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from neuron_port.errors import AdapterError
from neuron_port.families.parts import (
    MLP_ROLES,
    RoleView,
)


class ModelModules:
    """The module questions of a family adapter: projections by role (``q``, ``k``, ``v``, ``o``; ``gate``,
    ``up``, ``down``), never by a Hugging Face attribute name outside the adapter."""

    _ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
    _MLP = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}

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


__all__ = ["ModelModules"]
