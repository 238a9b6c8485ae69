"""Family adapters: the only code that knows a Hugging Face family's attribute names.

``family_for(model_type)`` returns the adapter for a config's ``model_type`` and
``family_of(model)`` the adapter of a model instance; anything unknown raises
:class:`~neuron_port.errors.UnsupportedArchitectureError`. Adapters subclass
:class:`~neuron_port.families.decoder.DecoderFamily`, the common Hugging Face decoder shape.
"""

from __future__ import annotations

from typing import Any

from neuron_port.errors import UnsupportedArchitectureError
from neuron_port.families.decoder import ATTENTION_ROLES, MLP_ROLES, DecoderFamily, SpecialIds
from neuron_port.families.gemma4 import GEMMA4, Gemma4Family
from neuron_port.families.llama import LLAMA, LlamaFamily
from neuron_port.families.qwen3 import QWEN3, Qwen3Family

FAMILIES: tuple[DecoderFamily, ...] = (GEMMA4, LLAMA, QWEN3)
_BY_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def supported_model_types() -> list[str]:
    """Every ``model_type`` an adapter accepts (text and multimodal wrapper types)."""
    return sorted(_BY_TYPE)


def family_for(model_type: str | None) -> DecoderFamily:
    """The adapter for ``model_type``, or a clear error listing what is supported."""
    try:
        return _BY_TYPE[model_type]  # type: ignore[index]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type}; supported: {', '.join(supported_model_types())}"
        ) from None


def register_family(family: DecoderFamily) -> DecoderFamily:
    """Make an adapter (an instance of a :class:`DecoderFamily` subclass) answer for its
    ``model_types``. Refuses a type another adapter already claims.

    Registration lives in the process that made it: gloo ranks are fresh processes, so an
    adapter used with ``tp > 1`` must be registered when its own module is imported.
    """
    taken = sorted(t for t in family.model_types if t in _BY_TYPE and _BY_TYPE[t] is not family)
    if taken:
        raise ValueError(f"model types {taken} already belong to another adapter "
                         f"({', '.join(sorted({_BY_TYPE[t].name for t in taken}))})")
    if not family.model_types:
        raise ValueError(f"adapter {family.name!r} declares no model_types")
    for model_type in family.model_types:
        _BY_TYPE[model_type] = family
    return family


def family_of(model: Any) -> DecoderFamily:
    """The adapter of a model instance (a CausalLM or a multimodal wrapper)."""
    return family_for(getattr(model.config, "model_type", None))


__all__ = [
    "ATTENTION_ROLES",
    "MLP_ROLES",
    "FAMILIES",
    "DecoderFamily",
    "SpecialIds",
    "family_for",
    "family_of",
    "register_family",
    "supported_model_types",
    "Gemma4Family",
    "LlamaFamily",
    "Qwen3Family",
]
