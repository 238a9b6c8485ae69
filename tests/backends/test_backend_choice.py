"""Choosing a backend: the CPU backend's two modes and what they promise the compile loop, the
single-KV-length rule of device-resident stores, and the XLA backend failing fast without torch-xla."""

import importlib.util

import pytest
import torch

from neuron_port.backends import get_backend
from neuron_port.backends.base import RESIDENT_KV_BACKENDS
from neuron_port.backends.cpu import CpuBackend
from neuron_port.errors import BackendUnavailableError
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape


def test_the_cpu_modes_say_what_their_graphs_take(tiny_e2b):
    jit, eager = get_backend("cpu"), get_backend("cpu-eager")
    assert isinstance(jit, CpuBackend) and jit.mode == "jit" and jit.static_batch and jit.inplace_kv_writes
    assert eager.mode == "eager" and not eager.static_batch and not eager.inplace_kv_writes
    with pytest.raises(ValueError, match="'jit' or 'eager', found 'aot'"):
        CpuBackend("aot")
    port = Port.over_model(tiny_e2b, PortShape([8], [16]))
    graph = port.graphs.decode[16]
    assert eager.compile(graph, [], graph.aliases) is graph  # eager: the module itself
    inputs, store = port.inputs.example_decode(16, 2)
    traced = jit.compile(graph, [*inputs, *store.tensors()], graph.aliases)
    assert isinstance(traced, torch.jit.ScriptModule)
    with pytest.raises(TypeError, match="only compiled"):
        eager.save(graph, None)


def test_the_resident_kv_backends_build_every_graph_at_once():
    """neuron and nxd keep the store on the device as one state for every graph: ModelBuilder traces all
    of a rank's graphs together, so compiling one graph at a time is refused by both."""
    from neuron_port.backends.neuron import NeuronBackend
    from neuron_port.backends.nxd_artifact import NxdBackend
    from neuron_port.errors import NeuronPortError

    assert {NeuronBackend.name, NxdBackend.name} == set(RESIDENT_KV_BACKENDS) == {"neuron", "nxd"}
    for backend in (NeuronBackend(), NxdBackend()):
        with pytest.raises(NeuronPortError, match="ModelBuilder"):
            backend.compile(None, [], {})


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch-xla is installed here")
def test_the_xla_backend_without_torch_xla_says_how_to_install_it(tiny_e2b):
    from neuron_port.backends.xla import XLA_HINT, require_xla
    from neuron_port.backends.xla_port import xla_port
    from neuron_port.model.layout import describe
    from neuron_port.parallel.ranks import RankSetup

    with pytest.raises(BackendUnavailableError, match="torch-xla") as raised:
        require_xla()
    assert XLA_HINT in str(raised.value) and "torch==2.8.0 torch-xla==2.8.0" in XLA_HINT
    before = {k: v.clone() for k, v in tiny_e2b.state_dict().items()}
    with pytest.raises(BackendUnavailableError):
        xla_port(tiny_e2b, RankSetup.for_layout(describe(tiny_e2b), 1), PortShape([8], [16]))
    assert all(torch.equal(v, tiny_e2b.state_dict()[k]) for k, v in before.items())  # nothing touched
    with pytest.raises(BackendUnavailableError):
        get_backend("xla")


def test_a_vendor_backend_without_its_sdk_fails_fast_with_the_install_hint(monkeypatch):
    import sys

    from neuron_port.backends.sdk import NEURON_HINT, check_backend_tp, require_backend
    from neuron_port.errors import NeuronPortError

    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import torch_neuronx -> ImportError, as if absent
    for name in ("neuron", "nxd"):
        with pytest.raises(BackendUnavailableError, match=f"backend '{name}' needs torch_neuronx") as raised:
            require_backend(name)
        assert NEURON_HINT in str(raised.value) and "\n" not in str(raised.value)
    require_backend("cpu")  # needs nothing
    check_backend_tp("nxd", 4)
    with pytest.raises(NeuronPortError, match="use --backend nxd"):
        check_backend_tp("neuron", 2)
