"""Family adapters: the only code that knows a Hugging Face family's attribute names.

``family_for(model_type)`` returns the adapter for a config's ``model_type``; anything else
raises :class:`~neuron_port.errors.UnsupportedArchitectureError`.
"""

from __future__ import annotations

from neuron_port.errors import UnsupportedArchitectureError
from neuron_port.families.gemma4 import GEMMA4, Gemma4Family

_FAMILIES = {model_type: GEMMA4 for model_type in GEMMA4.model_types}


def supported_model_types() -> list[str]:
    """Every ``model_type`` an adapter accepts (text and multimodal wrapper types)."""
    return sorted(_FAMILIES)


def family_for(model_type: str | None) -> Gemma4Family:
    """The adapter for ``model_type``, or a clear error listing what is supported."""
    try:
        return _FAMILIES[model_type]  # type: ignore[index]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type}; supported: {', '.join(supported_model_types())}"
        ) from None


__all__ = ["family_for", "supported_model_types", "Gemma4Family"]
