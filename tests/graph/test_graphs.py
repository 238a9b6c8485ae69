"""The graphs over a Hugging Face model: a decode graph that writes its new rows only gives the
blend's logits and store, compiling asks each graph for the write its backend keeps, and a prefill
graph writes exactly the slots its reference map names."""

import pytest
import torch

from neuron_port.errors import NeuronPortError
from neuron_port.graph.contracts import ArtifactGraphs, GraphCompiler
from neuron_port.graph.graphs import DecodeGraph
from neuron_port.graph.kv import KVStore, KVWrite
from neuron_port.graph.port import Port
from neuron_port.graph.runners import compile_graphs
from neuron_port.graph.shapes import PortShape
from neuron_port.graph.step import run_step
from neuron_port.model.layout import describe


def _decode_inputs(port: Port, kv_len: int, batch: int):
    g = torch.Generator().manual_seed(3)
    store = port.inputs.new_store(batch, kv_len)
    filled = [torch.randn(t.shape, generator=g) for t in store.tensors()]  # a store with history in it
    inputs = port.inputs.decode_fresh(torch.tensor([5, 9][:batch]), torch.tensor([20, 7][:batch]))
    return inputs, type(store).from_tensors(store.spec, filled)


def test_the_row_write_gives_the_blends_logits_and_store(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([8], [32]))
    graph = port.graphs.decode[32]
    assert isinstance(graph, DecodeGraph) and graph.kv_write is KVWrite.BLEND
    inputs, store = _decode_inputs(port, 32, 2)
    with torch.no_grad():
        want_logits, want_store = run_step(graph, inputs, store)
        graph.kv_write = KVWrite.ROWS
        got_logits, got_store = run_step(graph, inputs, store)
    assert torch.allclose(got_logits, want_logits, atol=1e-5, rtol=0)
    changed = 0
    for got, want, before in zip(got_store.tensors(), want_store.tensors(), store.tensors(), strict=True):
        assert torch.equal(got, want)
        changed += int((got != before).any(dim=-1).sum())
    assert changed > 0  # the step wrote rows, so equal stores are not two untouched copies


class _RecordingBackend:
    """Compiles nothing: records which write each graph was asked for."""

    name, kv_write, fixed_batch, inference_mode, leading_update = "recording", KVWrite.ROWS, True, True, None

    def __init__(self):
        self.asked = {}

    def compile(self, graph, example_inputs, aliases):
        self.asked[("prefill" if graph.prefill else "decode", graph.seq if graph.prefill else graph.spec.kv_len)] = (
            graph.kv_write)
        return graph


class _LoaderOnly:
    """Loads artifacts' graphs and compiles none (ModelBuilder's backends are such)."""

    name, kv_write = "loader", KVWrite.ROWS

    def load_graphs(self, rank_dir, files, host):
        return {}


def test_compiling_asks_decode_graphs_only_for_the_row_write(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([8, 16], [32, 64]))
    graphs = port.graphs
    backend = _RecordingBackend()
    assert isinstance(backend, GraphCompiler) and isinstance(_LoaderOnly(), ArtifactGraphs)
    assert not isinstance(_LoaderOnly(), GraphCompiler)
    with pytest.raises(NeuronPortError, match="_LoaderOnly compiles no graph in process"):
        compile_graphs(graphs, _LoaderOnly(), port.example_inputs)
    compile_graphs(graphs, backend, lambda kind, size, batch, store_rows: (
        port.inputs.example_prefill(size, batch) if kind == "prefill" else port.inputs.example_decode(size, batch)))
    assert backend.asked == {("prefill", 8): KVWrite.BLEND, ("prefill", 16): KVWrite.BLEND,
                             ("decode", 32): KVWrite.ROWS, ("decode", 64): KVWrite.ROWS}


def test_a_prefill_graph_writes_each_rows_prompt_where_its_map_says_and_nothing_else(tiny_e2b):
    """The graph wires its position ids, lengths and each owner's ring into the prefill write: a bucket
    of 16 over a window of 8 (so rings wrap), rows of lengths 16, 5 and 0, a store already holding
    values. The slots that change are exactly the slots the reference map writes, owner by owner
    (a swapped input, a wrong ring or a dropped length moves or widens them)."""
    from neuron_port.graph import masks

    port = Port.over_model(tiny_e2b, PortShape([16], [32]))
    spec = port.stores.specs[port.stores.prefill_kv[16]]
    assert spec.ring is not None and spec.ring < 16
    g = torch.Generator().manual_seed(5)
    store = port.inputs.new_store(3, spec.kv_len)
    filled = type(store).from_tensors(store.spec, [torch.randn(t.shape, generator=g) for t in store.tensors()])
    lengths = torch.tensor([16, 5, 0])
    inputs = port.inputs.prefill(torch.randint(0, 100, (3, 16), generator=g), lengths, 16)
    _, out = run_step(port.graphs.prefill[16], inputs, filled)
    full_map, ring_map = masks.prefill_writes(inputs.position_ids, lengths, spec.kv_len, spec.ring)
    for slot, before, after in zip(spec.slots, filled.keys, out.keys, strict=True):
        written = (ring_map if slot.ring else full_map).sum(dim=1) > 0  # [batch, slots]
        changed = (after != before).any(dim=-1).any(dim=1)  # [batch, slots]
        assert torch.equal(changed, written), slot
    assert all(torch.equal(a[2], b[2]) for a, b in zip(filled.tensors(), out.tensors(), strict=True))  # length 0


def test_a_decode_graph_on_a_prefix_of_one_larger_store_is_the_graph_of_its_length(tiny_e2b):
    """Decode by length over one store: the graph of KV length L handed the largest store (and its
    ``slot_ids``) gives the logits of the graph of L on that store's prefix, writes the same new rows
    there, and leaves every slot past the prefix as it was; with L at or under the sliding window its
    sliding owners are full-length while the store's are rings. Slot ids that name other positions
    change the logits (the input is read, not ignored); a prefix graph that would blend is refused."""
    window = _window(tiny_e2b)
    lengths = [window // 2, 2 * window, 8 * window]
    port = Port.over_model(tiny_e2b, PortShape([window // 2], lengths))
    largest = port.stores.largest
    model = port.graphs.decode[lengths[-1]].model
    for kv_len in lengths:
        spec = port.stores.specs[kv_len]
        _, full = _decode_inputs(port, lengths[-1], 2)  # the largest store, with history in it
        inputs = port.inputs.decode_fresh(torch.tensor([5, 9]), torch.tensor([kv_len - 1, kv_len // 2]))
        prefix_graph = DecodeGraph(model, spec, store=largest)
        prefix_graph.kv_write, prefix_graph.slot_input = KVWrite.ROWS, True
        own = DecodeGraph(model, spec)
        own.kv_write = KVWrite.ROWS
        with torch.no_grad():
            got = prefix_graph(*inputs, slot_ids(kv_len), *full.tensors())
            want_logits, want = run_step(own, inputs, KVStore.from_tensors(spec, [t.clone() for t in full.prefix(spec)]))
            shifted = prefix_graph(*inputs, slot_ids(kv_len) + 1, *full.tensors())
        assert torch.allclose(got[0], want_logits, atol=1e-5, rtol=0), kv_len
        assert not torch.allclose(shifted[0], want_logits, atol=1e-3, rtol=0), kv_len
        for out, before, new in zip(got[1:], full.tensors(), want.tensors(), strict=True):
            width = new.shape[2]
            assert out.shape == before.shape
            assert torch.equal(out[:, :, :width], new)  # the prefix: the graph of its length's store
            assert torch.equal(out[:, :, width:], before[:, :, width:])  # past it: untouched
    blending = DecodeGraph(model, port.stores.specs[lengths[0]], store=largest)
    blending.slot_input = True
    inputs, _ = _decode_inputs(port, lengths[0], 1)
    with pytest.raises(ValueError, match="expected kv_write 'rows', found 'blend'"):
        blending(*inputs, slot_ids(lengths[0]), *port.inputs.new_store(1, lengths[-1]).tensors())


def slot_ids(kv_len: int) -> torch.Tensor:
    return torch.arange(kv_len)


def _window(model) -> int:
    window = describe(model).sliding_window
    assert window and window >= 4, "the tiny E2B slides over a window of at least 4"
    return window
