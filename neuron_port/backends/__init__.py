"""Backends behind one protocol. Vendor SDKs are imported only inside the backend that needs them."""

from __future__ import annotations

from neuron_port.backends.sdk import NEURON_HINT, check_backend_tp, require_backend
from neuron_port.errors import NeuronPortError


def get_backend(name: str, **options):
    """A backend by name: ``cpu`` (TorchScript-traced), ``cpu-eager``, ``neuron``, ``xla``.

    ``options`` go to the backend's constructor (``cpu``: ``passes=False`` keeps the traced graph
    as traced; ``xla``: ``setup``, the rank setup to run as SPMD).
    neuronx-distributed's ModelBuilder (``nxd``, :mod:`neuron_port.backends.nxd_artifact`) builds a
    whole artifact at once rather than graph by graph (:func:`neuron_port.artifacts.writer.write_artifact`
    calls it); its backend object loads such an artifact's graphs."""
    if name in ("cpu", "cpu-eager"):
        from neuron_port.backends.cpu import CpuBackend

        return CpuBackend("eager" if name == "cpu-eager" else "jit", **options)
    if name == "xla":
        from neuron_port.backends.xla import XlaBackend

        return XlaBackend(**options)
    require_backend(name)
    if name == "neuron":
        from neuron_port.backends.neuron import NeuronBackend

        return NeuronBackend(**options)
    if name == "nxd":
        from neuron_port.backends.nxd_artifact import NxdBackend

        return NxdBackend(**options)
    raise NeuronPortError(f"unknown backend {name!r}; expected cpu, cpu-eager, neuron, nxd or xla")


__all__ = ["require_backend", "check_backend_tp", "get_backend", "NEURON_HINT"]
