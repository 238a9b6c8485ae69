"""Backends behind one protocol. Vendor SDKs are imported only inside the backend that needs them."""

from __future__ import annotations

from neuron_port.errors import NeuronPortError

NEURON_HINT = (
    "install the AWS Neuron SDK on an Inferentia2 host: "
    "pip install torch-neuronx neuronx-distributed --extra-index-url https://pip.repos.neuron.amazonaws.com "
    "(the PyPI packages of those names are placeholders that raise ImportError('WRONG PACKAGE'))"
)

_VENDOR_MODULE = {"neuron": "torch_neuronx", "nxd": "neuronx_distributed"}


class BackendUnavailableError(NeuronPortError, ImportError):
    """A backend whose vendor SDK is not installed."""


def require_backend(name: str) -> None:
    """Fail fast, with the install hint, when ``name`` needs an SDK that is absent."""
    module = _VENDOR_MODULE.get(name)
    if module is None:
        return
    try:
        __import__(module)
    except Exception as exc:  # ImportError, or the placeholder's ImportError("WRONG PACKAGE")
        raise BackendUnavailableError(f"backend {name!r} needs {module}, which is not usable here ({exc!r}); {NEURON_HINT}") from None


def get_backend(name: str, **options):
    """A backend by name: ``cpu`` (TorchScript-traced), ``cpu-eager``, ``neuron``, ``nxd``.

    ``options`` go to the backend's constructor (``cpu``: ``passes=False`` keeps the traced graph
    as traced; ``neuron``: ``auto_cast``)."""
    if name in ("cpu", "cpu-eager"):
        from neuron_port.backends.cpu import CpuBackend

        return CpuBackend("eager" if name == "cpu-eager" else "jit", **options)
    require_backend(name)
    if name == "neuron":
        from neuron_port.backends.neuron import NeuronBackend

        return NeuronBackend(**options)
    raise NeuronPortError(f"unknown backend {name!r}; expected cpu, cpu-eager, neuron or nxd")


__all__ = ["BackendUnavailableError", "require_backend", "get_backend", "NEURON_HINT"]
