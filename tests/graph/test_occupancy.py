"""Decode by occupancy: which row counts get their own decode graphs, which one a step runs, and the row views
of the one store those graphs read and write."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.errors import BucketError
from neuron_port.graph.kv import KVStore
from neuron_port.graph.shapes import PortShape, decode_rows_for, occupancy_rows, rows_for
from neuron_port.model.configs import load_config
from neuron_port.model.layout import describe


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300))
def test_occupancy_rows_are_the_powers_of_two_below_the_batch(batch):
    rows = occupancy_rows(batch)
    assert list(rows) == sorted(set(rows)) and all(r < batch and r & (r - 1) == 0 for r in rows)
    assert len(rows) == (batch - 1).bit_length()  # every power of two below it, none missing


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 64), st.data())
def test_a_step_runs_the_smallest_graph_that_holds_its_occupied_rows(batch, data):
    rows = data.draw(st.lists(st.integers(1, 64), max_size=6))
    needed = data.draw(st.integers(1, batch))
    chosen = rows_for(needed, batch, rows)
    candidates = [r for r in rows if r < batch] + [batch]
    assert chosen in candidates and chosen >= needed
    assert chosen == min(r for r in candidates if r >= needed)
    assert rows_for(needed, None, rows) == needed  # eager graphs take any row count


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.one_of(st.none(), st.lists(st.integers(-2, 80), max_size=8)))
def test_the_decode_rows_a_port_compiles_are_asked_rows_below_the_batch_or_the_powers_of_two(batch, asked):
    rows = decode_rows_for(batch, asked)
    assert list(rows) == sorted(set(rows)) and all(0 < r < batch for r in rows)
    if asked is None:
        assert rows == occupancy_rows(batch)
    else:
        assert set(rows) == {r for r in asked if 0 < r < batch}


def test_rows_out_of_range_are_refused():
    with pytest.raises(BucketError, match="found 0"):
        rows_for(0, 4, [1, 2])
    with pytest.raises(BucketError, match="found 5"):
        rows_for(5, 4, [1, 2])
    with pytest.raises(BucketError, match="at least 1 row"):
        occupancy_rows(0)


@pytest.fixture(scope="module")
def stores():
    return PortShape([8], [16, 32]).stores(describe(load_config("gemma-4-e2b", tiny=True)))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 4), kv=st.sampled_from([16, 32]), seed=st.integers(0, 1000))
def test_row_views_share_the_store_and_write_back_their_rows_only(stores, rows, kv, seed):
    gen = torch.Generator().manual_seed(seed)
    store = KVStore.from_tensors(stores.largest, [torch.randn(t.shape, generator=gen)
                                                  for t in KVStore.zeros(stores.largest, 4).tensors()])
    before = [t.clone() for t in store.tensors()]
    view = store.prefix(stores.specs[kv], rows)
    assert all(v.shape[0] == rows and v.data_ptr() == t.data_ptr() for v, t in zip(view.tensors(), store.tensors(),
                                                                                      strict=True))
    answer = KVStore.from_tensors(view.spec, [torch.full_like(v, 7.0) for v in view.tensors()])  # a step's copies
    store.write_prefix(answer)
    for t, old, new in zip(store.tensors(), before, answer.tensors(), strict=True):
        width = new.shape[2]
        assert torch.equal(t[:rows, :, :width], new)  # the step's rows and slots landed
        assert torch.equal(t[rows:], old[rows:])  # the other rows are untouched
        assert torch.equal(t[:rows, :, width:], old[:rows, :, width:])  # and so are the slots past the view
    with pytest.raises(ValueError, match="1..4 rows"):
        store.prefix(stores.specs[kv], 5)
