"""The middle layer's values: port shapes, the KV store's flat form, graph aliases, and the KV-head gather
passed explicitly."""


from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port import describe, load_config
from neuron_port.errors import BucketError
from neuron_port.graph.attention import KV_EXPAND
from neuron_port.graph.kv import KVStore, kv_store_spec
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape, select_bucket
from neuron_port.graph.step import INPUT_NAMES, StepInputs, kv_aliases, run_step
from neuron_port.parallel.launch import identity_reduce
from neuron_port.parallel.ranks import RankSetup, make_rank
from tests.helpers import straddling_model


# ---- shapes and typed values -----------------------------------------------------------------
@settings(max_examples=40)
@given(
    buckets=st.lists(st.integers(1, 300), min_size=1, max_size=4), kv_lens=st.lists(st.integers(1, 600), min_size=1, max_size=3)
)
def test_port_shape_accepts_exactly_buckets_within_the_largest_kv(buckets, kv_lens):
    if min(buckets) >= 1 and max(buckets) <= max(kv_lens):
        shape = PortShape(buckets, kv_lens)
        assert list(shape.buckets) == sorted(set(buckets)) and list(shape.kv_lens) == sorted(set(kv_lens))
        stores = shape.stores(describe(load_config("gemma-4-e2b", tiny=True)))
        for bucket, kv in stores.prefill_kv.items():
            assert kv >= bucket and all(k < bucket for k in shape.kv_lens if k < kv)
            assert select_bucket(bucket, shape.buckets) == bucket
    else:
        with pytest.raises(BucketError):
            PortShape(buckets, kv_lens)


def test_kv_store_flat_form_round_trips_and_names_a_wrong_count():
    layout = describe(load_config("gemma-4-12b", tiny=True))
    spec = kv_store_spec(layout, 64)
    store = KVStore.zeros(spec, 2)
    assert len(store.keys) == len(store.values) == len(spec.slots)
    again = KVStore.from_tensors(spec, store.tensors())
    assert all(a is b for a, b in zip(again.tensors(), store.tensors(), strict=True)) and list(store) == store.tensors()
    with pytest.raises(ValueError, match=f"has {2 * len(spec.slots)} tensors, found 3"):
        KVStore.from_tensors(spec, store.tensors()[:3])


def test_graph_aliases_follow_the_step_inputs():
    assert INPUT_NAMES == StepInputs._fields and len(INPUT_NAMES) == 4
    assert kv_aliases(4) == {4: 1, 5: 2, 6: 3, 7: 4}


def test_the_kv_head_gather_is_passed_explicitly_and_is_load_bearing():
    model = straddling_model()
    setup = RankSetup.for_layout(describe(model), 2)
    rank = make_rank(setup, 0, identity_reduce, model)
    assert not any(name.startswith("np_") for m in rank.model.modules() for name, _ in m.named_buffers(recurse=False))
    port = Port.for_rank(rank, PortShape(16, 32))
    assert {n for n, _ in port.graphs.decode[port.kv_len].named_buffers() if n.startswith("kv_expand")} == {
        f"kv_expand_{i}" for i in rank.kv_expand
    }
    inputs, store = port.inputs.example_decode(32)
    run_step(port.runners.decode[32], inputs, store)  # with the gathers: runs
    without = Port.over_model(rank.model, PortShape([16], [32]), rank.layout, rank.local_kv_heads)  # no kv_expand given
    with pytest.raises(ValueError, match=KV_EXPAND):
        run_step(without.runners.decode[32], *without.inputs.example_decode(32))
