"""Backends: what each name is (:mod:`neuron_port.backends.registry`) and the object behind it. Vendor SDKs are
imported only inside the backend that needs them."""

from __future__ import annotations

from typing import Any

from neuron_port.backends.registry import BACKENDS, BackendSpec, backend_spec
from neuron_port.backends.sdk import NEURON_HINT, check_backend_tp, require_backend


def get_backend(name: str, **options: Any) -> Any:
    """A backend by name: ``cpu`` (TorchScript-traced), ``cpu-eager``, ``xla`` (each a
    :class:`~neuron_port.graph.contracts.GraphCompiler`), ``neuron``, ``nxd`` (each loads artifacts only).
    An unknown name is refused with the names there are (:func:`~neuron_port.backends.registry.backend_spec`).

    ``options`` go to the backend's constructor (``cpu``: ``passes=False`` keeps the traced graph
    as traced; ``xla``: ``setup``, the rank setup to run as SPMD).
    neuronx-distributed's ModelBuilder (``nxd``, :mod:`neuron_port.backends.nxd_artifact`) builds a
    whole artifact at once rather than graph by graph (:func:`neuron_port.artifacts.writer.write_artifact`
    calls it); its backend object loads such an artifact's graphs."""
    import importlib

    spec = backend_spec(name)
    if spec.sdk_modules:
        require_backend(name)  # one line naming the SDK it needs, before its module is imported
    module, cls = spec.factory.split(":")
    return getattr(importlib.import_module(module), cls)(**{**dict(spec.options), **options})


__all__ = ["require_backend", "check_backend_tp", "get_backend", "backend_spec", "BackendSpec", "BACKENDS", "NEURON_HINT"]
