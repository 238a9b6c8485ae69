"""What each backend name is, declared once: every other layer asks here instead of comparing names.

A backend is one of two kinds (:mod:`neuron_port.graph.contracts`): an in-process graph compiler (``cpu``,
``cpu-eager``, ``xla``: handed each graph by :func:`~neuron_port.graph.runners.compile_graphs`) or a whole-artifact
builder (``neuron``, ``nxd``: neuronx-distributed's ModelBuilder traces every graph of every core at once and
one executor drives them all from one process). The CPU backends also save and load artifacts graph by graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_port.errors import NeuronPortError

_MODELBUILDER_ADVICE = ("write an artifact with 'neuron-port compile MODEL --backend {name} --out DIR' and run it with "
                        "'neuron-port generate DIR'")


@dataclass(frozen=True)
class BackendSpec:
    """One backend name's facts.

    ``sdk_modules``: the vendor modules it needs (imported only to check them); ``in_process``: it compiles
    graph by graph in this process; ``artifacts``: ``neuron-port compile`` writes artifacts with it;
    ``whole_artifact``: ModelBuilder traces every graph of every core at once, over one device-resident KV store,
    and one process drives every core (the artifact has one host rank); ``max_tp``: the largest tensor-parallel
    degree it runs (None: any); ``float32_exact``: its float32 graphs give Hugging Face's float32 tokens
    exactly (the CPU and the XLA CPU device); ``refusal``: why it compiles nothing graph by graph, and what to
    do instead; ``factory``: ``module:Class`` of its backend object, imported when one is made
    (:func:`~neuron_port.backends.get_backend`); ``options``: the keyword arguments the name fixes."""

    name: str
    sdk_modules: tuple[str, ...] = ()
    in_process: bool = True
    artifacts: bool = True
    whole_artifact: bool = False
    max_tp: int | None = None
    float32_exact: bool = False
    refusal: str = ""
    factory: str = ""
    options: tuple[tuple[str, object], ...] = ()


_NEURON_SDK = ("torch_neuronx", "neuronx_distributed")  # neuron is ModelBuilder at tp 1: it needs both too

BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in (
    BackendSpec("cpu", float32_exact=True, factory="neuron_port.backends.cpu:CpuBackend", options=(("mode", "jit"),)),
    BackendSpec("cpu-eager", float32_exact=True, factory="neuron_port.backends.cpu:CpuBackend",
                options=(("mode", "eager"),)),
    BackendSpec("xla", artifacts=False, float32_exact=True, factory="neuron_port.backends.xla:XlaBackend"),
    BackendSpec("neuron", _NEURON_SDK, in_process=False, whole_artifact=True, max_tp=1,
                factory="neuron_port.backends.neuron:NeuronBackend",
                refusal="the neuron backend builds every graph at once with neuronx-distributed's ModelBuilder at tp 1 "
                        "(weights loaded once, one KV state for all graphs, as the SDK documents); "
                        + _MODELBUILDER_ADVICE.format(name="neuron")),
    BackendSpec("nxd", _NEURON_SDK, in_process=False, whole_artifact=True,
                factory="neuron_port.backends.nxd_artifact:NxdBackend",
                refusal="the nxd backend traces every graph at once with ModelBuilder; "
                        + _MODELBUILDER_ADVICE.format(name="nxd")),
)}
"""Every backend name, in the order ``--backend`` lists them."""


def backend_spec(name: str) -> BackendSpec:
    """The facts of backend ``name``; a clear error naming the backends there are."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise NeuronPortError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}") from None


def artifact_backends() -> list[str]:
    """The backends ``neuron-port compile`` writes artifacts with."""
    return [name for name, spec in BACKENDS.items() if spec.artifacts]


__all__ = ["BackendSpec", "BACKENDS", "backend_spec", "artifact_backends"]
