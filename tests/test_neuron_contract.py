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
from neuron_port.errors import NeuronPortError
from neuron_port.model.layout import describe
from neuron_port.model.loading import build_model
from neuron_port.model.configs import load_config
from neuron_port.graph.port import Port


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


class _Traced:
    """What the stand-in's trace returns: the module run eagerly, its aliased outputs written back
    into the alias-key tensors (the state a device keeps between calls)."""

    def __init__(self, func, aliases):
        self.func, self.aliases = func, aliases

    def __call__(self, *inputs):
        out = self.func(*inputs)
        with torch.no_grad():
            for tensor, index in self.aliases.items():
                tensor.copy_(out[index])
        return out


class RecordingNeuronx(types.ModuleType):
    def __init__(self):
        super().__init__("torch_neuronx")
        self.traces: list[dict] = []
        self.replaced: list[tuple] = []

    def trace(self, func, example_inputs, **kwargs):
        check_trace_call(func, kwargs)
        traced = _Traced(func, dict(kwargs.get("input_output_aliases", {})))
        self.traces.append({"func": func, "kwargs": kwargs, "traced": traced, "inputs": example_inputs})
        return traced

    def replace_weights(self, neuron_model, weights):
        record = next(t for t in self.traces if t["traced"] is neuron_model)
        if record["kwargs"].get("inline_weights_to_neff", True):
            raise RuntimeError("replace_weights needs a model traced with inline_weights_to_neff=False")
        own = neuron_model.func.state_dict(keep_vars=True)
        for name, tensor in weights.items():
            own[name].data = tensor  # the model now runs on the tensors it was given
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
        kwargs = record["kwargs"]
        assert kwargs["inline_weights_to_neff"] is False
        assert kwargs["compiler_args"] == ["--model-type", "transformer", "--auto-cast", "none"]
        # the KV store: parameters of the traced module, aliased by those tensors to outputs 1..n
        kv = list(record["func"].kv)
        assert kv and list(kwargs["input_output_aliases"].items()) == [(p, 1 + i) for i, p in enumerate(kv)]
        assert len(record["inputs"]) == 8  # the step inputs only; the store is not an input
    # one state bound to every graph: the same weight tensors and the same KV tensors each time
    pointers = [{k: v.data_ptr() for k, v in weights.items()} for _, weights in neuronx.replaced]
    assert any(k.startswith("kv.") for k in pointers[0]) and any(k.startswith("graph.model.") for k in pointers[0])
    assert all(p == pointers[0] for p in pointers[1:])


def test_a_rank_binds_one_kv_length(neuronx):
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    port = Port(model, describe(model), [16], [32, 64])
    with pytest.raises(NeuronPortError, match="one KV length"):
        port.compile(NeuronBackend())


def test_the_old_call_is_caught_by_the_contract(neuronx):
    """Input indices as alias keys (what the backend used to pass) fail as torch-neuronx fails."""
    graph = _port().graphs.decode[64]
    with pytest.raises(TypeError, match="must be Tensor, not int"):
        check_trace_call(graph, {"input_output_aliases": graph.aliases})


def test_compiled_graphs_still_match_the_eager_port(neuronx):
    from neuron_port.generation.generate import greedy_generate

    prompt = [2, 40, 41, 42, 43]
    eager = greedy_generate(_port(), [prompt], 6).tokens
    port = _port()
    port.compile(NeuronBackend())
    assert greedy_generate(port, [prompt], 6).tokens == eager


def test_graphs_that_keep_their_own_store_are_caught(neuronx, monkeypatch):
    """Bound without the shared store, decode reads a store prefill never wrote: its logits differ."""
    from neuron_port.generation.generate import greedy_generate

    prompt = [2, 40, 41, 42, 43]
    eager = greedy_generate(_port(), [prompt], 4, keep_logits=True)
    monkeypatch.setattr(NeuronBackend, "_bind", lambda self, state: dict(state))
    port = _port()
    port.compile(NeuronBackend())
    own = greedy_generate(port, [prompt], 4, keep_logits=True)
    assert (own.step_logits[1] - eager.step_logits[1]).abs().max() > 1e-2
