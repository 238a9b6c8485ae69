"""Choosing a backend: the CPU backend's two modes and what they promise the compile loop, the
single-KV-length rule of device-resident stores, and the XLA backend failing fast without torch-xla."""

import importlib.util

import pytest
import torch

from neuron_port.backends import get_backend
from neuron_port.backends.cpu import CpuBackend
from neuron_port.backends.registry import BACKENDS, artifact_backends, backend_spec
from neuron_port.errors import BackendUnavailableError
from neuron_port.graph.contracts import ArtifactGraphs, GraphCompiler, GraphSaver
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape


def test_the_cpu_modes_say_what_their_graphs_take(tiny_e2b):
    jit, eager = get_backend("cpu"), get_backend("cpu-eager")
    assert isinstance(jit, CpuBackend) and jit.mode == "jit" and jit.fixed_batch and jit.kv_write == "in_place"
    assert eager.mode == "eager" and not eager.fixed_batch and eager.kv_write == "blend"
    with pytest.raises(ValueError, match="'jit' or 'eager', found 'aot'"):
        CpuBackend("aot")
    port = Port.over_model(tiny_e2b, PortShape([8], [16]))
    graph = port.graphs.decode[16]
    assert eager.compile(graph, [], graph.aliases) is graph  # eager: the module itself
    inputs, store = port.inputs.example_decode(16, 2)
    traced = jit.compile(graph, [*inputs, *store.tensors()], graph.aliases)
    assert isinstance(traced, torch.jit.ScriptModule)
    assert isinstance(jit, GraphCompiler) and isinstance(jit, GraphSaver) and isinstance(eager, GraphCompiler)
    with pytest.raises(TypeError, match="only compiled"):
        eager.save_graphs({"decode_16.pt": graph}, None, {})


def test_the_resident_kv_backends_build_every_graph_at_once(tiny_e2b):
    """neuron and nxd keep the store on the device as one state for every graph: ModelBuilder traces all
    of a rank's graphs together, so they load artifacts and compiling one graph at a time is refused by both."""
    from neuron_port.backends.neuron import NeuronBackend
    from neuron_port.backends.nxd_artifact import NxdBackend
    from neuron_port.errors import NeuronPortError

    whole = {name for name, spec in BACKENDS.items() if spec.whole_artifact}
    assert {NeuronBackend.name, NxdBackend.name} == whole == {"neuron", "nxd"}
    assert {name for name, spec in BACKENDS.items() if spec.in_process} == {"cpu", "cpu-eager", "xla"}
    assert artifact_backends() == ["cpu", "cpu-eager", "neuron", "nxd"]
    port = Port.over_model(tiny_e2b, PortShape([8], [16]))
    for backend in (NeuronBackend(), NxdBackend()):
        assert isinstance(backend, ArtifactGraphs) and not isinstance(backend, GraphCompiler)
        assert backend.kv_write == "rows"  # the decode write ModelBuilder's graphs are traced with
        with pytest.raises(NeuronPortError, match="build whole artifacts"):
            port.compile(backend)


def test_every_name_makes_its_own_backend_object():
    """The registry's factory is the only dispatch: each name's object, with the options the name fixes."""
    from neuron_port.backends.cpu import CpuBackend
    from neuron_port.backends.neuron import NeuronBackend
    from neuron_port.backends.nxd_artifact import NxdBackend
    from neuron_port.backends.xla import XlaBackend

    want = {"cpu": CpuBackend, "cpu-eager": CpuBackend, "xla": XlaBackend, "neuron": NeuronBackend, "nxd": NxdBackend}
    assert {name: importlib.import_module(spec.factory.split(":")[0]).__dict__[spec.factory.split(":")[1]]
            for name, spec in BACKENDS.items()} == want
    assert get_backend("cpu").mode == "jit" and get_backend("cpu-eager").mode == "eager"
    assert get_backend("cpu", passes=False).passes is False


def test_an_unknown_backend_is_refused_with_the_names_there_are():
    from neuron_port.backends import require_backend
    from neuron_port.errors import NeuronPortError

    for call in (get_backend, backend_spec, require_backend):
        with pytest.raises(NeuronPortError, match="unknown backend 'tpu'; expected one of cpu, cpu-eager, xla, neuron, nxd"):
            call("tpu")


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


def test_the_xla_backend_refuses_an_in_place_kv_write():
    """A lazy graph returns what it writes: asked to write the store in place, it says which kinds it takes
    (before it looks for torch-xla)."""
    from neuron_port.backends.xla import XlaBackend
    from neuron_port.graph.kv import KVWrite

    with pytest.raises(ValueError, match="expected kv_write 'rows' or 'blend', found 'in_place'"):
        XlaBackend(kv_write=KVWrite.IN_PLACE)


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
