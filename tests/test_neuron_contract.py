"""Contract test of the single-core Neuron backend: what it hands ``torch_neuronx`` against the
documented API (torch-neuronx API reference, SDK 2.28). Not a hardware result: a recording stand-in
replaces the ``torch_neuronx`` module, and the traced graph is a CPU TorchScript trace.

Documented rules checked:
* ``trace(func, example_inputs, *, input_output_aliases={}, compiler_args=..., inline_weights_to_neff=True)``;
  alias keys are tensors of ``func``'s own state (torch-neuronx matches them with ``torch.equal``),
  values output indices;
* ``replace_weights(neuron_model, weights)`` applies only to a model traced with
  ``inline_weights_to_neff=False``; ``weights`` is a module or a state dict.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from neuron_port.backends.neuron import NeuronBackend
from neuron_port.layout import describe
from neuron_port.models import build_model
from neuron_port.configs import load_config
from neuron_port.port import Port


def check_trace_call(func, kwargs: dict) -> None:
    """Raise as the documented API would refuse the call."""
    state = list(func.state_dict(keep_vars=True).values())
    for key, out in dict(kwargs.get("input_output_aliases", {})).items():
        if not isinstance(key, torch.Tensor):
            # torch-neuronx runs torch.equal(key, tensor) over the module's tensors
            raise TypeError(f"equal(): argument 'input' must be Tensor, not {type(key).__name__}")
        if not any(key is t for t in state):
            raise ValueError("an alias key is not a tensor of the traced module")
        if not isinstance(out, int):
            raise TypeError("alias values are output indices")


class RecordingNeuronx(types.ModuleType):
    def __init__(self):
        super().__init__("torch_neuronx")
        self.traces: list[dict] = []
        self.replaced: list[tuple] = []

    def trace(self, func, example_inputs, **kwargs):
        check_trace_call(func, kwargs)
        traced = torch.jit.trace(func, example_inputs, check_trace=False, strict=False)
        self.traces.append({"func": func, "kwargs": kwargs, "traced": traced})
        return traced

    def replace_weights(self, neuron_model, weights):
        record = next(t for t in self.traces if t["traced"] is neuron_model)
        if record["kwargs"].get("inline_weights_to_neff", True):
            raise RuntimeError("replace_weights needs a model traced with inline_weights_to_neff=False")
        self.replaced.append((neuron_model, weights))


@pytest.fixture
def neuronx(monkeypatch):
    fake = RecordingNeuronx()
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    return fake


def _port():
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    return Port(model, describe(model), [16, 32], [64])


def test_the_backend_call_follows_the_documented_api(neuronx):
    port = _port()
    port.compile(NeuronBackend())
    assert len(neuronx.traces) == 3 and len(neuronx.replaced) == 3
    for record in neuronx.traces:
        assert record["kwargs"]["inline_weights_to_neff"] is False
        assert record["kwargs"]["compiler_args"] == ["--model-type", "transformer", "--auto-cast", "none"]
    # one set of weights bound to every graph: the same parameter tensors each time
    pointers = [{k: v.data_ptr() for k, v in weights.items() if k.startswith("model.")} for _, weights in neuronx.replaced]
    assert pointers[0] and all(p == pointers[0] for p in pointers[1:])


def test_the_old_call_is_caught_by_the_contract(neuronx):
    """Input indices as alias keys (what the backend used to pass) fail as torch-neuronx fails."""
    graph = _port().graphs.decode[64]
    with pytest.raises(TypeError, match="must be Tensor, not int"):
        check_trace_call(graph, {"input_output_aliases": graph.aliases})


def test_compiled_graphs_still_match_the_eager_port(neuronx):
    from neuron_port.generation import greedy_generate

    prompt = [2, 40, 41, 42, 43]
    eager = greedy_generate(_port(), [prompt], 6).tokens
    port = _port()
    port.compile(NeuronBackend())
    assert greedy_generate(port, [prompt], 6).tokens == eager
