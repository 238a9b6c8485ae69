"""Family adapters: the only code that knows a Hugging Face family's attribute names.

``family_for(model_type)`` returns the adapter for a config's ``model_type`` and
``family_of(model)`` the adapter of a model instance; anything unknown raises
:class:`~neuron_port.errors.UnsupportedArchitectureError`. Adapters subclass
:class:`~neuron_port.families.decoder.DecoderFamily`, the common Hugging Face decoder shape.

Three kinds of adapter answer: the shipped ones below, plugins of other pip-installed
distributions (the ``neuron_port.families`` entry-point group, :mod:`.plugins`, read on the first
lookup; a plugin replaces a shipped adapter of the same model type with a warning), and adapters
registered in this process with :func:`register_family`. :func:`adapter_source` says which one
built a model (artifacts record it).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from neuron_port.errors import UnsupportedArchitectureError
from neuron_port.families.decoder import DecoderFamily
from neuron_port.families.gemma3 import GEMMA3, Gemma3Family
from neuron_port.families.gemma4 import GEMMA4, Gemma4Family
from neuron_port.families.llama import LLAMA, LlamaFamily
from neuron_port.families.mistral import MISTRAL, MistralFamily
from neuron_port.families.parts import ATTENTION_ROLES, MLP_ROLES, RoleView, SpecialIds
from neuron_port.families.phi3 import PHI3, Phi3Family
from neuron_port.families.plugins import AdapterSource, class_path, discover, shipped_source
from neuron_port.families.qwen2 import QWEN2, Qwen2Family
from neuron_port.families.qwen3 import QWEN3, Qwen3Family

FAMILIES: tuple[DecoderFamily, ...] = (GEMMA4, LLAMA, QWEN3, MISTRAL, QWEN2, GEMMA3, PHI3)
_BY_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_SHIPPED = {id(family) for family in FAMILIES}
_SOURCES: dict[int, AdapterSource] = {id(family): shipped_source(family) for family in FAMILIES}
_PLUGINS: list[DecoderFamily] = []  # every plugin adapter loaded, kept alive (sources are keyed by id)
_plugins_state = "unread"  # -> "reading" -> "read"
_plugins_lock = threading.RLock()


def _load_plugins() -> None:
    """Install the entry-point adapters once per process (first come by distribution name; later
    claims warn). Other threads wait while one reads them; a plugin module that looks an adapter
    up while it is imported (same thread) sees the table as it stands."""
    global _plugins_state
    if _plugins_state == "read":
        return
    with _plugins_lock:
        if _plugins_state != "unread":
            return
        _plugins_state = "reading"
        try:
            _install_plugins()
        finally:
            _plugins_state = "read"


def _install_plugins() -> None:
    claimed: dict[str, AdapterSource] = {}
    for family, source in discover():
        _PLUGINS.append(family)
        _SOURCES[id(family)] = source
        taken = sorted(t for t in family.model_types if t in claimed)
        if taken:
            warnings.warn(f"the plugin adapter {source.adapter_class} of {source.requirement()} is ignored for model "
                          f"types {taken}: another plugin claims them", RuntimeWarning, stacklevel=4)
        replaced = sorted({class_path(_BY_TYPE[t]) for t in family.model_types
                           if t not in claimed and id(_BY_TYPE.get(t)) in _SHIPPED})
        if replaced:
            warnings.warn(f"the plugin adapter {source.adapter_class} of {source.requirement()} replaces the shipped "
                          f"adapter {', '.join(replaced)}", RuntimeWarning, stacklevel=4)
        for model_type in family.model_types:
            if model_type not in claimed:
                claimed[model_type] = source
                _BY_TYPE[model_type] = family


def supported_model_types() -> list[str]:
    """Every ``model_type`` an adapter accepts (text and multimodal wrapper types), plugins included."""
    _load_plugins()
    return sorted(_BY_TYPE)


def family_for(model_type: str | None) -> DecoderFamily:
    """The adapter for ``model_type``, or a clear error listing what is supported."""
    _load_plugins()
    try:
        return _BY_TYPE[model_type]  # type: ignore[index]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type}; supported: {', '.join(supported_model_types())} "
            "(an adapter of another package must be pip-installed with a 'neuron_port.families' entry point)"
        ) from None


def adapter_source(family: DecoderFamily) -> AdapterSource:
    """Which adapter class and distribution (with version) ``family`` is; ``register_family``
    adapters count as their module's (no distribution)."""
    source = _SOURCES.get(id(family))
    if source is None:
        return AdapterSource(family.name, class_path(family), "(registered in process)", None)
    return source


def register_family(family: DecoderFamily) -> DecoderFamily:
    """Make an adapter (an instance of a :class:`DecoderFamily` subclass) answer for its
    ``model_types``. Refuses a type another adapter already claims.

    Registration lives in the process that made it: gloo ranks are fresh processes, so an
    adapter used with ``tp > 1`` must be registered when its own module is imported.
    """
    _load_plugins()
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
    "adapter_source",
    "AdapterSource",
    "supported_model_types",
    "RoleView",
    "Gemma3Family",
    "Gemma4Family",
    "LlamaFamily",
    "MistralFamily",
    "Phi3Family",
    "Qwen2Family",
    "Qwen3Family",
]
