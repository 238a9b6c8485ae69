"""Whether a vendor SDK a backend needs is usable here, and what to install when it is not."""

from __future__ import annotations

from neuron_port.backends.registry import backend_spec
from neuron_port.errors import BackendUnavailableError, NeuronPortError

NEURON_HINT = (
    "install the AWS Neuron SDK on an Inferentia2 host: "
    "pip install torch-neuronx neuronx-distributed --extra-index-url https://pip.repos.neuron.amazonaws.com "
    "(the PyPI packages of those names are placeholders that raise ImportError('WRONG PACKAGE'))"
)


def require_backend(name: str) -> None:
    """Fail fast, with the install hint, when ``name`` needs an SDK that is absent."""
    for module in backend_spec(name).sdk_modules:
        try:
            __import__(module)
        except Exception as exc:  # ImportError, or the placeholder's ImportError("WRONG PACKAGE")
            reason = " ".join(repr(exc).split())  # one line, whatever the placeholder prints
            raise BackendUnavailableError(f"backend {name!r} needs {module}, which is not usable here ({reason}); "
                                          f"{NEURON_HINT}") from None


def check_backend_tp(name: str, tp: int) -> None:
    """Refuse a tensor-parallel degree the backend cannot run.

    ``neuron`` is one NeuronCore (ModelBuilder at tp 1); tensor parallelism on Neuron is ``nxd``,
    the same ModelBuilder at any degree."""
    largest = backend_spec(name).max_tp
    if largest is not None and tp > largest:
        cores = "one NeuronCore" if largest == 1 else f"{largest} NeuronCores"
        raise NeuronPortError(f"--backend {name} compiles for {cores} and cannot run tp {tp}: "
                              "use --backend nxd (the same ModelBuilder path, any tp) for tensor parallelism")


__all__ = ["NEURON_HINT", "require_backend", "check_backend_tp"]
