"""Prefill masks equal Hugging Face's definition, sliding windows included."""


import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.models.gemma4.modeling_gemma4 import sliding_window_mask_function

from neuron_port.graph import masks


@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 30))
def test_prefill_masks_match_hf_definition(batch, bucket, window):
    full, sliding = masks.prefill_masks(torch.arange(bucket).expand(batch, bucket), window)
    hf_visible = sliding_window_mask_function((window, 0))
    for q in range(bucket):
        for k in range(bucket):
            assert (sliding[0, 0, q, k] == 0) == bool(hf_visible(0, 0, q, k))
            assert (full[0, 0, q, k] == 0) == (k <= q)


@given(st.integers(1, 4), st.sampled_from([(16, 8, 8), (16, None, 4), (12, None, None)]), st.data())
def test_step_maps_are_the_builders_maps_made_where_the_inputs_are(batch, layout, data):
    """A graph builds its maps from its inputs: prefill's from the position ids and prompt lengths,
    decode's from the new token's position (length - 1); every tensor with dimensions is made on the
    inputs' device (the meta device here: a builder that made one on the host would fail to combine
    with it; a 0-dim host scalar combines with any device, so it is not caught, and is not a fault)."""
    kv_len, ring, window = layout
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, 8), min_size=batch, max_size=batch)))
    steps = torch.arange(8).expand(batch, 8)
    got = masks.step_maps(steps, lengths, True, kv_len, window, ring)
    assert torch.equal(got.mask_full, masks.prefill_masks(steps, window)[0])
    assert torch.equal(got.last_onehot, masks.last_token_onehot(steps, lengths))
    assert got.write_full is None and got.write_sliding is None  # a prefill writes its rows by position
    for row, length in enumerate(lengths.tolist()):  # each row's last real token picked
        assert got.last_onehot[row].tolist() == [float(p == length - 1) for p in range(8)]
    for row, length in enumerate(lengths.tolist()):  # each real token written once by the reference map
        written = masks.prefill_writes(steps, lengths, kv_len, ring)[0][row].sum(dim=-1)
        assert written.tolist() == [1.0] * length + [0.0] * (8 - length)
    positions = torch.tensor(data.draw(st.lists(st.integers(0, kv_len - 1), min_size=batch, max_size=batch)))
    got = masks.step_maps(positions[:, None], positions + 1, False, kv_len, window, ring)
    assert torch.equal(got.mask_sliding, masks.decode_masks(positions, kv_len, window, ring)[1])
    assert torch.equal(got.write_full, masks.decode_writes(positions, kv_len, ring)[0])
    assert torch.equal(got.last_onehot, torch.ones(batch, 1))
    for prefill, seq in ((True, 8), (False, 1)):
        on_meta = masks.step_maps(steps[:, :seq].to("meta"), lengths.to("meta"), prefill, kv_len, window, ring)
        assert all(t.device.type == "meta" for t in on_meta if t is not None)


@given(st.integers(1, 24), st.sampled_from([None, 4]), st.sampled_from([None, 4]), st.lists(st.integers(0, 23), min_size=1,
                                                                                            max_size=3))
def test_decode_maps_from_given_slot_ids_equal_the_ones_built_in_the_graph(kv_len, window, ring, positions):
    """A decode graph keyed by its length takes its slots' positions as an input: the same masks and write
    maps as the ones it builds itself; slot ids of another length are refused."""
    ring = None if window is None else ring
    positions = torch.tensor([min(p, kv_len - 1) for p in positions])
    slots = torch.arange(kv_len)
    for built, given_ids in zip(masks.decode_masks(positions, kv_len, window, ring),
                                masks.decode_masks(positions, kv_len, window, ring, slot_ids=slots), strict=True):
        assert torch.equal(built, given_ids)
    for built, given_ids in zip(masks.decode_writes(positions, kv_len, ring),
                                masks.decode_writes(positions, kv_len, ring, slot_ids=slots), strict=True):
        assert torch.equal(built, given_ids)
    with pytest.raises(ValueError, match=rf"\[{kv_len}\]; found \({kv_len + 1},\)"):
        masks.decode_masks(positions, kv_len, window, ring, slot_ids=torch.arange(kv_len + 1))
