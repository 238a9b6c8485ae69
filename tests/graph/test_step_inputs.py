"""A decode step's inputs: the preallocated scratch path equals the reference builders and reuses its buffers."""


import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape


@given(st.integers(1, 4), st.sampled_from([(16, 8), (32, None), (8, None), (64, 8)]), st.data())
@settings(max_examples=40)
def test_preallocated_decode_inputs_equal_the_reference_builders(tiny_e2b, batch, kv_ring, data):
    """The in-place scratch path gives exactly the embeddings, positions and lengths of a fresh decode."""
    kv_len, ring = kv_ring
    port = Port.over_model(tiny_e2b, PortShape([8], [kv_len], ring_buffers=ring is not None))
    assert port.stores.rings[kv_len] == ring
    for _ in range(3):  # reuse the same scratch tensors across steps
        positions = torch.tensor(data.draw(st.lists(st.integers(0, kv_len - 1), min_size=batch, max_size=batch)))
        tokens = torch.tensor(data.draw(st.lists(st.integers(0, 511), min_size=batch, max_size=batch)))
        want = port.inputs.decode_fresh(tokens, positions)
        got = port.inputs.decode(tokens, positions)
        for name, a, b in zip(("embeds", "per_layer", "positions", "lengths"), got, want, strict=True):
            assert a.shape == b.shape and torch.equal(a, b), name


def test_decode_step_reuses_its_buffers(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([8], [32]))
    first = port.inputs.decode(torch.tensor([5]), torch.tensor([9]))
    second = port.inputs.decode(torch.tensor([6]), torch.tensor([10]))
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(first, second, strict=True))
