"""Gemma-4's drafters: what the library needs to know about ``gemma4_assistant`` and ``gemma4_unified_assistant``.

Every Gemma-4 size ships a small drafter for speculative decoding (transformers' ``Gemma4AssistantForCausalLM``
and ``Gemma4UnifiedAssistantForCausalLM``). It keeps no KV of its own: each of its layers reads the K/V of its
target's *producer* of that attention type (the last layer of the type that is not itself KV-shared, whose
``kv_sharing_modes`` entry is ``"store"``), which is always an owner of the port's store. Its input is
``concat(target embedding of the last seen token, target final hidden state)`` through ``pre_projection``; it
drafts ``k`` tokens from one position and feeds ``post_projection`` of its state back as the next hidden state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from neuron_port.errors import DrafterError

DRAFTER_TYPES = {"gemma4_assistant": "gemma4_text", "gemma4_unified_assistant": "gemma4_unified_text"}
"""A drafter's model type -> the text model type of the target it drafts for."""

_CLASSES = {
    "gemma4_assistant": ("transformers", "Gemma4AssistantConfig", "Gemma4AssistantForCausalLM"),
    "gemma4_unified_assistant": ("transformers.models.gemma4_unified_assistant", "Gemma4UnifiedAssistantConfig",
                                 "Gemma4UnifiedAssistantForCausalLM"),
}
TINY_DRAFTER_HIDDEN = 32


def drafter_classes(model_type: str) -> tuple[type, type]:
    """(config class, CausalLM class) of a drafter model type."""
    import importlib

    if model_type not in _CLASSES:
        raise DrafterError(f"a drafter is one of {sorted(_CLASSES)}, found model_type {model_type!r}")
    module, config_name, model_name = _CLASSES[model_type]
    where = importlib.import_module(module)
    return getattr(where, config_name), getattr(where, model_name)


def drafter_type(target_config: Any) -> str:
    """The drafter model type of a target (``gemma4_assistant`` for a ``gemma4_text`` one, ...)."""
    kind = next((d for d, t in DRAFTER_TYPES.items() if t == target_config.model_type), None)
    if kind is None:
        raise DrafterError(f"a {target_config.model_type} model has no Gemma-4 drafter (drafters: "
                           f"{sorted(DRAFTER_TYPES)}, for {sorted(set(DRAFTER_TYPES.values()))}): use prompt lookup")
    return kind


def producer_layers(target_config: Any) -> dict[str, int]:
    """Attention type -> the target layer whose K/V a drafter layer of that type reads (its ``"store"`` layer)."""
    modes = target_config.kv_sharing_modes
    return {target_config.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}


def check_drafter(target_config: Any, drafter_config: Any) -> None:
    """Refuse a drafter that cannot read this target: another drafter type, vocabulary, backbone width or sliding
    window, or an attention type whose KV-head count or head size differs from the target producer's it reads."""
    kind = drafter_config.model_type
    if DRAFTER_TYPES.get(kind) != target_config.model_type:
        raise DrafterError(f"a {target_config.model_type} target takes a {drafter_type(target_config)} drafter, "
                           f"found {kind!r}")
    text = drafter_config.get_text_config()
    if text.vocab_size != target_config.vocab_size:
        raise DrafterError(f"the drafter's vocabulary has {text.vocab_size} tokens, its target's {target_config.vocab_size}")
    if drafter_config.backbone_hidden_size != target_config.hidden_size:
        raise DrafterError(f"the drafter was trained on a {drafter_config.backbone_hidden_size}-wide backbone, its "
                           f"target is {target_config.hidden_size} wide")
    if text.sliding_window != target_config.sliding_window:
        raise DrafterError(f"the drafter's sliding window is {text.sliding_window} positions, its target's "
                           f"{target_config.sliding_window}: it reads the target's rings")
    producers = producer_layers(target_config)
    for i, kind_of_layer in enumerate(text.layer_types):
        if kind_of_layer not in producers:
            raise DrafterError(f"drafter layer {i} is {kind_of_layer!r}; the target stores K/V only for "
                               f"{sorted(producers)}")
        want, got = target_config.per_layer_config[producers[kind_of_layer]], text.per_layer_config[i]
        if (got.head_dim, got.num_key_value_heads) != (want.head_dim, want.num_key_value_heads):
            raise DrafterError(f"drafter layer {i} ({kind_of_layer}) reads {got.num_key_value_heads} KV heads of "
                               f"{got.head_dim}; target layer {producers[kind_of_layer]} stores "
                               f"{want.num_key_value_heads} of {want.head_dim}")


@dataclass(frozen=True)
class DrafterParts:
    """A drafter's modules, by what they do: ``text_model`` (its layers, all KV-shared), ``pre_projection`` (target
    embedding and hidden in), ``post_projection`` (its state back to the target's width), ``head_weight`` [vocab,
    hidden] and ``centroid_head`` (the ordered-embedding head, or None)."""

    text_model: nn.Module
    pre_projection: nn.Module
    post_projection: nn.Module
    head_weight: torch.Tensor
    centroid_head: nn.Module | None


def drafter_parts(drafter: nn.Module) -> DrafterParts:
    """The modules of a ``Gemma4AssistantForCausalLM`` / ``Gemma4UnifiedAssistantForCausalLM``."""
    return DrafterParts(drafter.model, drafter.pre_projection, drafter.post_projection, drafter.lm_head.weight,
                        drafter.masked_embedding)


def use_eager_attention(drafter_config: Any) -> None:
    """Set transformers' eager attention on a drafter's config and its text part."""
    drafter_config._attn_implementation = "eager"
    drafter_config.get_text_config()._attn_implementation = "eager"


def drafter_vocab_size(drafter_config: Any) -> int:
    return int(drafter_config.get_text_config().vocab_size)


@torch.no_grad()
def seed_drafter_buffers(drafter: nn.Module, generator: torch.Generator) -> None:
    """Draw what transformers initialises to defaults: each layer's ``layer_scalar`` in [0.5, 1.0) and, with the
    centroid head, its token order (a permutation of the vocabulary; zeros would put every token in one cluster)."""
    for layer in drafter.model.layers:
        layer.layer_scalar.copy_(0.5 + 0.5 * torch.rand(layer.layer_scalar.shape, generator=generator))
    if drafter.masked_embedding is not None:
        vocab = drafter_vocab_size(drafter.config)
        drafter.masked_embedding.token_ordering.copy_(torch.randperm(vocab, generator=generator))


def tiny_drafter_config(target_config: Any, text_dict: dict[str, Any], ordered: bool = False,
                        centroids: int = 8, top_k: int = 2) -> Any:
    """A tiny drafter for ``target_config`` (tests, ``--tiny``): two layers (one per attention type, the last full),
    the target's vocabulary, window, RoPE, query and KV heads, a narrower width; ``text_dict`` is the target's text config
    as a dict (its family's ``config_to_dict``). ``ordered``: the centroid head (``use_ordered_embeddings``) with
    ``centroids`` clusters of which ``top_k`` are scored."""
    config_class, _ = drafter_classes(drafter_type(target_config))
    text = {k: v for k, v in text_dict.items() if k not in ("architectures", "transformers_version", "model_type")}
    text.update(hidden_size=TINY_DRAFTER_HIDDEN, intermediate_size=2 * TINY_DRAFTER_HIDDEN, num_hidden_layers=2,
                layer_types=["sliding_attention", "full_attention"],
                num_kv_shared_layers=2, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                use_double_wide_mlp=False, enable_moe_block=False)
    text_config_class = type(target_config)
    return config_class(text_config=text_config_class(**text), backbone_hidden_size=target_config.hidden_size,
                        use_ordered_embeddings=ordered, num_centroids=centroids, centroid_intermediate_top_k=top_k)


__all__ = ["DRAFTER_TYPES", "DrafterParts", "drafter_parts", "use_eager_attention", "drafter_vocab_size",
           "seed_drafter_buffers", "drafter_type", "drafter_classes", "producer_layers", "check_drafter", "tiny_drafter_config",
           "TINY_DRAFTER_HIDDEN"]
