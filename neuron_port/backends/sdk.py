"""Whether a vendor SDK a backend needs is usable here, and what to install when it is not."""

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


__all__ = ["NEURON_HINT", "BackendUnavailableError", "require_backend"]
