"""The graphs over a Hugging Face model: a decode graph that writes its new rows only gives the
blend's logits and store, and compiling asks each graph for the write its backend keeps."""

import torch

from neuron_port.graph.graphs import DecodeGraph
from neuron_port.graph.port import Port
from neuron_port.graph.runners import compile_graphs
from neuron_port.graph.shapes import PortShape
from neuron_port.graph.step import run_step


def _decode_inputs(port: Port, kv_len: int, batch: int):
    g = torch.Generator().manual_seed(3)
    store = port.inputs.new_store(batch, kv_len)
    filled = [torch.randn(t.shape, generator=g) for t in store.tensors()]  # a store with history in it
    inputs = port.inputs.decode_fresh(torch.tensor([5, 9][:batch]), torch.tensor([20, 7][:batch]), kv_len)
    return inputs, type(store).from_tensors(store.spec, filled)


def test_the_row_write_gives_the_blends_logits_and_store(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([8], [32]))
    graph = port.graphs.decode[32]
    assert isinstance(graph, DecodeGraph) and not graph.row_kv_writes
    inputs, store = _decode_inputs(port, 32, 2)
    with torch.no_grad():
        want_logits, want_store = run_step(graph, inputs, store)
        graph.row_kv_writes = True
        got_logits, got_store = run_step(graph, inputs, store)
    assert torch.allclose(got_logits, want_logits, atol=1e-5, rtol=0)
    changed = 0
    for got, want, before in zip(got_store.tensors(), want_store.tensors(), store.tensors(), strict=True):
        assert torch.equal(got, want)
        changed += int((got != before).any(dim=-1).sum())
    assert changed > 0  # the step wrote rows, so equal stores are not two untouched copies


class _RecordingBackend:
    """Compiles nothing: records which write each graph was asked for."""

    row_kv_writes = True

    def __init__(self):
        self.asked = {}

    def compile(self, graph, example_inputs, aliases):
        self.asked[("prefill" if graph.prefill else "decode", graph.seq if graph.prefill else graph.spec.kv_len)] = (
            graph.row_kv_writes, graph.inplace_kv_writes)
        return graph


def test_compiling_asks_decode_graphs_only_for_the_row_write(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([8, 16], [32, 64]))
    graphs = port.graphs
    backend = _RecordingBackend()
    compile_graphs(graphs, backend, lambda kind, size, batch: (
        port.inputs.example_prefill(size, batch) if kind == "prefill" else port.inputs.example_decode(size, batch)))
    assert backend.asked == {("prefill", 8): (False, False), ("prefill", 16): (False, False),
                             ("decode", 32): (True, False), ("decode", 64): (True, False)}
