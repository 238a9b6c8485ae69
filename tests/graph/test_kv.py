"""The KV store: one-hot writes equal index assignment, the prefill's write by position, the decode row write
and the in-place decode write equal the blend, rings hold the sliding window."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.gemma4.modeling_gemma4 import sliding_window_mask_function

from neuron_port.graph import masks
from neuron_port.graph.kv import (
    KVSlotSpec,
    KVStore,
    KVStoreSpec,
    KVWrite,
    onehot_write,
    prefill_write,
    prefix_slots,
    row_write,
    scatter_write_,
)
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.graph.step import run_step


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


def _decode_write_case(batch: int, heads: int, slots: int, data, allow_empty: bool):
    """(store [batch, heads, slots, 4], one new row per batch row [batch, heads, 1, 4], its one-hot map
    [batch, 1, slots]); with ``allow_empty`` a row's map may be all zeros (a row that writes nothing)."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    buf = torch.randn(batch, heads, slots, 4, generator=g, dtype=torch.float64)
    new = torch.randn(batch, heads, 1, 4, generator=g, dtype=torch.float64)
    onehot = torch.zeros(batch, 1, slots, dtype=torch.float64)
    for b in range(batch):
        slot = data.draw(st.integers(-1 if allow_empty else 0, slots - 1))
        if slot >= 0:
            onehot[b, 0, slot] = 1
    return buf, new, onehot


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 12), st.data())
def test_in_place_decode_write_equals_the_onehot_blend(batch, heads, slots, data):
    buf, new, onehot = _decode_write_case(batch, heads, slots, data, allow_empty=False)
    expected = onehot_write(buf, new, onehot)
    out = scatter_write_(buf, new, onehot)
    assert out is buf and torch.equal(out, expected)


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 12), st.data())
def test_the_row_write_equals_the_onehot_blend(batch, heads, slots, data):
    """Each row writes its one slot, or none (a row whose map is empty keeps its store as it was)."""
    buf, new, onehot = _decode_write_case(batch, heads, slots, data, allow_empty=True)
    before = buf.clone()
    out = row_write(buf, new, onehot)
    assert torch.equal(out, onehot_write(buf, new, onehot)) and torch.equal(buf, before)  # a new tensor


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(2, 12), st.integers(2, 5), st.data())
def test_a_verify_steps_row_writes_equal_the_onehot_blend(batch, heads, slots, steps, data):
    """A verify step's rows (steps >= 2), each at its own slot or (past the store) at none: the row write and the
    in-place write give the blend's store, the row write a new tensor."""
    steps = min(steps, slots)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    buf = torch.randn(batch, heads, slots, 4, generator=g, dtype=torch.float64)
    new = torch.randn(batch, heads, steps, 4, generator=g, dtype=torch.float64)
    onehot = torch.zeros(batch, steps, slots, dtype=torch.float64)
    for b in range(batch):
        targets = data.draw(st.lists(st.integers(0, slots - 1), min_size=steps, max_size=steps, unique=True))
        written = data.draw(st.integers(1, steps))  # the steps past the store select no slot
        for t, s in enumerate(targets[:written]):
            onehot[b, t, s] = 1
    expected, before = onehot_write(buf, new, onehot), buf.clone()
    assert torch.equal(row_write(buf, new, onehot), expected) and torch.equal(buf, before)
    out = scatter_write_(buf, new, onehot)
    assert out is buf and torch.equal(out, expected)


def test_each_kv_write_kind_names_its_write_and_only_those_kinds_exist():
    assert [kind.write for kind in KVWrite] == [onehot_write, scatter_write_, row_write]
    assert KVWrite("rows") is KVWrite.ROWS and KVWrite.IN_PLACE == "in_place"  # the manifest's spelling
    with pytest.raises(ValueError, match="'inplace' is not a valid KVWrite"):
        KVWrite("inplace")


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 24), st.one_of(st.none(), st.integers(1, 12)), st.data())
def test_the_prefill_write_by_position_equals_the_blend_of_its_map(batch, heads, steps, ring, data):
    """A prompt right-padded to ``steps``, rows of any real length (0 included), into a store that already
    holds values: a buffer by position (ring None, any number of slots from ``steps``) or a ring."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    slots = ring if ring is not None else steps + data.draw(st.integers(0, 8))
    buf = torch.randn(batch, heads, slots, 4, generator=g, dtype=torch.float64)
    new = torch.randn(batch, heads, steps, 4, generator=g, dtype=torch.float64)
    lengths = torch.tensor(data.draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch)))
    positions = torch.arange(steps).expand(batch, steps)
    w_full, w_ring = masks.prefill_writes(positions, lengths, slots, ring, torch.float64)
    before = buf.clone()
    out = prefill_write(buf, new, positions, lengths, ring)
    assert torch.equal(out, onehot_write(buf, new, w_ring if ring is not None else w_full))
    assert torch.equal(buf, before)  # a new tensor
    if ring is None:
        with pytest.raises(ValueError, match="does not fit a buffer"):
            prefill_write(buf[:, :, : steps - 1], new, positions, lengths, None)


@given(st.integers(1, 9), st.integers(1, 60), st.integers(0, 40))
def test_ring_slots_hold_exactly_the_hf_sliding_window(window, prompt_len, decode_steps):
    """Prefill writes + decode writes into a ring reproduce HF's sliding visibility at every step."""
    ring = window
    hf_visible = sliding_window_mask_function((window, 0))
    # positions held by each slot, tracked through the one-hot write maps
    held = torch.full((ring,), -1)
    _, w_slide = masks.prefill_writes(torch.arange(prompt_len)[None], torch.tensor([prompt_len]),
                                      prompt_len + decode_steps + 1, ring)
    positions = torch.arange(prompt_len).double()
    held = torch.where(w_slide[0].sum(0) > 0, (w_slide[0].T.double() @ positions).long(), held)
    assert torch.equal(held, masks.ring_positions(torch.tensor([prompt_len - 1]), ring)[0])
    # the graphs' write by position puts the same positions in the same slots
    by_position = prefill_write(torch.full((1, 1, ring, 1), -1.0, dtype=torch.float64), positions.view(1, 1, -1, 1),
                                torch.arange(prompt_len)[None], torch.tensor([prompt_len]), ring)
    assert torch.equal(by_position.view(ring).long(), held)
    for t in range(prompt_len, prompt_len + decode_steps):
        _, w = masks.decode_writes(torch.tensor([t]), t + 1, ring)
        held = torch.where(w[0, 0] > 0, torch.tensor(t), held)
        _, m = masks.decode_masks(torch.tensor([t]), t + 1, window, ring)
        visible = {int(p) for p, ok in zip(held, m[0, 0, 0] == 0, strict=True) if ok}
        expected = {k for k in range(t + 1) if bool(hf_visible(0, 0, t, k))}
        assert visible == expected


@pytest.fixture(scope="module")
def tiny_e2b_port_64(tiny_e2b):
    """Eager graphs over the tiny E2B at KV lengths 8, 16, 32 and 64."""
    return Port.over_model(tiny_e2b, PortShape([8], [8, 16, 32, 64]))


@given(st.sampled_from([(5, 8), (7, 8), (4, 16), (12, 32), (20, 64)]), st.data())
@settings(max_examples=12, deadline=None)
def test_a_decode_step_on_a_prefix_is_the_step_on_the_whole_store(tiny_e2b_port_64, lengths, data):
    """The tiny E2B's window is 8: a short store (full-length sliding owners below the window, a ring
    above it) viewed in a longer one gives the longer graph's logits and writes the same rows."""
    position, short = lengths
    port = tiny_e2b_port_64
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    big = KVStore.from_tensors(port.stores.specs[64], [torch.randn(t.shape, generator=g)
                                                       for t in port.inputs.new_store(2, 64).tensors()])
    tokens, positions = torch.tensor([5, 11]), torch.tensor([position, position - 3])
    with torch.no_grad():
        want_logits, want = run_step(port.runners.decode[64], port.inputs.decode_fresh(tokens, positions), big)
        views = big.prefix(port.stores.specs[short])
        assert all(v.data_ptr() == t.data_ptr() for v, t in zip(views.tensors(), big.tensors(), strict=True))  # no copy
        got_logits, answer = run_step(port.runners.decode[short], port.inputs.decode_fresh(tokens, positions), views)
    big.write_prefix(answer)
    # tolerance: relative to the largest logit (a softmax over 8 slots or over 64 with the rest masked
    # sums in another order); a wrong slot or mask is off by the size of the logits themselves
    assert (got_logits - want_logits).abs().max() < 1e-4 * want_logits.abs().max()
    for got, expected in zip(big.tensors(), want.tensors(), strict=True):
        assert torch.allclose(got[:, :, :short], expected[:, :, :short], atol=1e-5, rtol=0)


def test_a_prefix_must_be_one():
    full = KVStoreSpec(64, 8, (KVSlotSpec(0, "full", 1, 4, 64, False), KVSlotSpec(1, "sliding", 1, 4, 8, True)))
    store = KVStore.zeros(full, 1)
    longer = KVStoreSpec(128, 8, (KVSlotSpec(0, "full", 1, 4, 128, False), KVSlotSpec(1, "sliding", 1, 4, 8, True)))
    with pytest.raises(ValueError, match="layer 0: 128 slots"):
        store.prefix(longer)
    other = KVStoreSpec(32, 8, (KVSlotSpec(0, "full", 1, 4, 32, False),))
    with pytest.raises(ValueError, match="owners"):
        store.prefix(other)


def test_prefix_slots_are_each_owners_leading_slots_and_a_non_prefix_is_refused(tiny_e2b):
    """A store at a shorter length is a prefix of the longest one: each owner's full-length buffer cut to
    the shorter length, a sliding owner's ring kept whole (or, under the window, cut to the shorter length);
    the other way round is refused, naming the layer."""
    port = Port.over_model(tiny_e2b, PortShape([4], [4, 16, 64]))
    specs = port.stores.specs
    for kv_len in (4, 16, 64):
        widths = prefix_slots(specs[64], specs[kv_len])
        assert widths == [slot.slots for slot in specs[kv_len].slots]
        assert all(w <= big.slots for w, big in zip(widths, specs[64].slots, strict=True))
    rings = [w for w, slot in zip(prefix_slots(specs[64], specs[16]), specs[16].slots, strict=True) if slot.ring]
    assert rings and set(rings) == {8}  # the window's ring, whole
    with pytest.raises(ValueError, match="are not a prefix of"):
        prefix_slots(specs[16], specs[64])
