"""Host inputs built directly: the decode scratch gives the values of the mask and write builders
for each KV layout, and a prefill's maps write exactly each row's real tokens and pick its last one."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.graph import masks
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.host_inputs import HostInputs
from neuron_port.graph.port import Port
from neuron_port.graph.scratch import DecodeScratch
from neuron_port.graph.shapes import PortShape


def _embeddings(vocab: int = 50, hidden: int = 6, layers: int = 3, per_layer: int = 2) -> HostEmbeddings:
    g = torch.Generator().manual_seed(0)
    return HostEmbeddings(torch.randn(vocab, hidden, generator=g), torch.randn(vocab, layers * per_layer, generator=g),
                          layers, per_layer, word_scale=2.0, ple_scale=0.5)


@given(st.integers(1, 3), st.sampled_from([(16, 8, 8), (16, None, 4), (12, None, None), (20, 6, 6)]), st.data())
@settings(max_examples=30, deadline=None)
def test_the_scratch_fills_what_the_builders_build(batch, layout, data):
    """(kv_len, ring, window): rings, full-length sliding buffers, and no sliding layers at all."""
    kv_len, ring, window = layout
    embeddings = _embeddings()
    scratch = DecodeScratch(batch, kv_len, ring, window, embeddings, torch.float32)
    for _ in range(2):  # the same tensors, filled again
        positions = torch.tensor(data.draw(st.lists(st.integers(0, kv_len - 1), min_size=batch, max_size=batch)))
        tokens = torch.tensor(data.draw(st.lists(st.integers(0, 49), min_size=batch, max_size=batch)))
        got = scratch.fill(tokens, positions)
        m_full, m_slide = masks.decode_masks(positions, kv_len, window, ring, torch.float32)
        w_full, w_slide = masks.decode_writes(positions, kv_len, ring, torch.float32)
        assert torch.equal(got.mask_full, m_full) and torch.equal(got.write_full, w_full)
        if window is not None:  # without sliding layers the sliding inputs only mirror the full ones
            assert torch.equal(got.mask_sliding, m_slide) and torch.equal(got.write_sliding, w_slide)
        words, per_layer = embeddings.embed(tokens[:, None])
        assert torch.equal(got.inputs_embeds, words) and torch.equal(got.per_layer, per_layer)
        assert torch.equal(got.position_ids, positions[:, None])


def test_a_prefill_writes_each_rows_real_tokens_and_picks_its_last(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([16], [32]))
    inputs: HostInputs = port.inputs
    assert isinstance(inputs, HostInputs)
    lengths = torch.tensor([16, 5, 1])
    ids = torch.arange(3 * 16).view(3, 16) % 100
    step = inputs.prefill(ids, lengths, 16)
    assert step.inputs_embeds.shape[:2] == (3, 16) and torch.equal(step.position_ids[1], torch.arange(16))
    for row, length in enumerate(lengths.tolist()):
        written = step.write_full[row].sum(dim=-1)  # [16]: one slot per real token, none for padding
        assert written[:length].eq(1).all() and written[length:].eq(0).all()
        assert step.last_onehot[row].argmax().item() == length - 1 and step.last_onehot[row].sum().item() == 1
    store = inputs.new_store(3, 32)
    assert all(t.shape[0] == 3 and not t.any() for t in store.tensors())
