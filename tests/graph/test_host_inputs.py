"""Host inputs built directly: the decode scratch gives a fresh decode's values, a prefill's lengths
give maps that write exactly each row's real tokens and pick its last one, and no input grows with
the KV length."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.graph import masks
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.host_inputs import HostInputs
from neuron_port.graph.kv import prefill_write
from neuron_port.graph.port import Port
from neuron_port.graph.scratch import DecodeScratch
from neuron_port.graph.shapes import PortShape


def _embeddings(vocab: int = 50, hidden: int = 6, layers: int = 3, per_layer: int = 2) -> HostEmbeddings:
    g = torch.Generator().manual_seed(0)
    return HostEmbeddings(torch.randn(vocab, hidden, generator=g), torch.randn(vocab, layers * per_layer, generator=g),
                          layers, per_layer, word_scale=2.0, ple_scale=0.5)


@given(st.integers(1, 3), st.data())
@settings(max_examples=30, deadline=None)
def test_the_scratch_fills_what_a_fresh_decode_builds(batch, data):
    embeddings = _embeddings()
    scratch = DecodeScratch(batch, embeddings)
    for _ in range(2):  # the same tensors, filled again
        positions = torch.tensor(data.draw(st.lists(st.integers(0, 99), min_size=batch, max_size=batch)))
        tokens = torch.tensor(data.draw(st.lists(st.integers(0, 49), min_size=batch, max_size=batch)))
        got = scratch.fill(tokens, positions)
        words, per_layer = embeddings.embed(tokens[:, None])
        assert torch.equal(got.inputs_embeds, words) and torch.equal(got.per_layer, per_layer)
        assert torch.equal(got.position_ids, positions[:, None]) and torch.equal(got.lengths, positions + 1)


def test_a_prefill_writes_each_rows_real_tokens_and_picks_its_last(tiny_e2b):
    """The host hands over lengths; the graph writes exactly each row's real tokens from them (a row of
    length 0 writes nothing) and picks its last one."""
    port = Port.over_model(tiny_e2b, PortShape([16], [32]))
    inputs: HostInputs = port.inputs
    assert isinstance(inputs, HostInputs)
    lengths = torch.tensor([16, 5, 1, 0])
    ids = torch.arange(4 * 16).view(4, 16) % 100
    step = inputs.prefill(ids, lengths, 16)
    assert step.inputs_embeds.shape[:2] == (4, 16) and torch.equal(step.position_ids[1], torch.arange(16))
    assert torch.equal(step.lengths, lengths)
    spec = port.stores.specs[port.stores.prefill_kv[16]]
    maps = masks.step_maps(step.position_ids, step.lengths, True, spec.kv_len, spec.window, spec.ring)
    full = next(s for s in spec.slots if not s.ring)
    buf = torch.full(full.shape(4), -1.0)
    new = torch.arange(1, 17, dtype=torch.float32).view(1, 1, 16, 1).expand(4, full.n_kv, 16, full.head_dim)
    written = prefill_write(buf, new, step.position_ids, step.lengths, None)[:, 0, :, 0]  # [4, slots]: step t + 1 in slot t
    for row, length in enumerate(lengths.tolist()):
        assert written[row].tolist() == [float(t + 1) for t in range(length)] + [-1.0] * (full.slots - length)
        assert maps.last_onehot[row].sum().item() == min(length, 1)
        if length:
            assert maps.last_onehot[row].argmax().item() == length - 1
    store = inputs.new_store(4, 32)
    assert all(t.shape[0] == 4 and not t.any() for t in store.tensors())
    with pytest.raises(ValueError, match=r"prefill expects ids \[batch, 16\]"):
        inputs.prefill(ids[:, :8], lengths, 16)
    with pytest.raises(ValueError, match=r"lengths in 0..16 \(the bucket\), found \[17, 5, 1, 0\]"):
        inputs.prefill(ids, torch.tensor([17, 5, 1, 0]), 16)


def test_no_step_input_grows_with_the_kv_length(tiny_e2b):
    """The maps are the graph's to build: a step's inputs are the same tensors at every KV length."""
    port = Port.over_model(tiny_e2b, PortShape([16], [32, 512]))
    (prefill, _), (decode, _) = port.example_inputs("prefill", 16), port.example_inputs("decode", 512)
    assert all(t.numel() <= 16 * tiny_e2b.config.hidden_size * 4 for t in (*prefill, *decode))


def test_a_verify_step_feeds_its_tokens_at_consecutive_positions(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([16], [64]))
    tokens, start = torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.tensor([4, 20])
    inputs = port.inputs.verify(tokens, start)
    embeds, per_layer = port.inputs.embeddings.embed(tokens)
    assert torch.equal(inputs.inputs_embeds, embeds) and torch.equal(inputs.per_layer, per_layer)
    assert inputs.position_ids.tolist() == [[4, 5, 6], [20, 21, 22]] and inputs.lengths.tolist() == [7, 23]
    one = port.inputs.verify(tokens[:, :1], start)  # one token: a decode step's inputs
    fresh = port.inputs.decode_fresh(tokens[:, 0], start)
    assert all(torch.equal(a, b) for a, b in zip(one, fresh, strict=True))
    with pytest.raises(ValueError, match="tokens \\[batch, S\\] and start \\[batch\\]"):
        port.inputs.verify(tokens[0], start)
