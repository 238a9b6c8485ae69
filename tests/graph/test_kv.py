"""The KV store: one-hot writes equal index assignment, the in-place decode write equals the blend, rings hold
the sliding window."""


import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.models.gemma4.modeling_gemma4 import sliding_window_mask_function

from neuron_port.graph import masks
from neuron_port.graph.kv import onehot_write, scatter_write_


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 12), st.integers(1, 5), st.data())
def test_onehot_write_equals_index_assignment(batch, heads, slots, steps, data):
    steps = min(steps, slots)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    buf = torch.randn(batch, heads, slots, 4, generator=g, dtype=torch.float64)
    new = torch.randn(batch, heads, steps, 4, generator=g, dtype=torch.float64)
    onehot = torch.zeros(batch, steps, slots, dtype=torch.float64)
    expected = buf.clone()
    for b in range(batch):
        targets = data.draw(st.lists(st.integers(0, slots - 1), min_size=steps, max_size=steps, unique=True))
        for t, s in enumerate(targets):
            onehot[b, t, s] = 1
            expected[b, :, s] = new[b, :, t]
    assert torch.equal(onehot_write(buf, new, onehot), expected)


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 12), st.data())
def test_in_place_decode_write_equals_the_onehot_blend(batch, heads, slots, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    buf = torch.randn(batch, heads, slots, 4, generator=g, dtype=torch.float64)
    new = torch.randn(batch, heads, 1, 4, generator=g, dtype=torch.float64)
    onehot = torch.zeros(batch, 1, slots, dtype=torch.float64)
    for b in range(batch):
        onehot[b, 0, data.draw(st.integers(0, slots - 1))] = 1
    expected = onehot_write(buf, new, onehot)
    out = scatter_write_(buf, new, onehot)
    assert out is buf and torch.equal(out, expected)


@given(st.integers(1, 9), st.integers(1, 60), st.integers(0, 40))
def test_ring_slots_hold_exactly_the_hf_sliding_window(window, prompt_len, decode_steps):
    """Prefill writes + decode writes into a ring reproduce HF's sliding visibility at every step."""
    ring = window
    hf_visible = sliding_window_mask_function((window, 0))
    # positions held by each slot, tracked through the one-hot write maps
    held = torch.full((ring,), -1)
    _, w_slide = masks.prefill_writes(torch.tensor([prompt_len]), prompt_len, prompt_len + decode_steps + 1, ring)
    positions = torch.arange(prompt_len).double()
    held = torch.where(w_slide[0].sum(0) > 0, (w_slide[0].T.double() @ positions).long(), held)
    assert torch.equal(held, masks.ring_positions(torch.tensor([prompt_len - 1]), ring)[0])
    for t in range(prompt_len, prompt_len + decode_steps):
        _, w = masks.decode_writes(torch.tensor([t]), t + 1, ring)
        held = torch.where(w[0, 0] > 0, torch.tensor(t), held)
        _, m = masks.decode_masks(torch.tensor([t]), t + 1, window, ring)
        visible = {int(p) for p, ok in zip(held, m[0, 0, 0] == 0, strict=True) if ok}
        expected = {k for k in range(t + 1) if bool(hf_visible(0, 0, t, k))}
        assert visible == expected
