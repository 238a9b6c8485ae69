"""The one path from model to ranks to graphs: shapes, typed step values, ranks, one compile loop,
one generate entry point, artifacts written and read through the same ranks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port import describe, load_config
from neuron_port.artifacts.reader import artifact_setup, load_rank_port
from neuron_port.artifacts.writer import write_artifact
from neuron_port.backends import get_backend
from neuron_port.checks.oracle import reference_generate
from neuron_port.errors import BucketError
from neuron_port.families import family_for
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.attention import KV_EXPAND
from neuron_port.graph.kv import KVStore, kv_store_spec
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape, select_bucket
from neuron_port.graph.step import INPUT_NAMES, StepInputs, kv_aliases, run_step
from neuron_port.model.configs import load_config_dict, tiny_config_dict
from neuron_port.model.loading import build_model, save_model_dir
from neuron_port.parallel.launch import identity_reduce
from neuron_port.parallel.ranks import Rank, RankSetup, make_rank, run_ranks

PROMPT = [2, 17, 33, 5, 92, 41, 7, 300, 12, 58, 9, 77, 140, 3, 64, 211, 18, 25]


@pytest.fixture(scope="module")
def e2b():
    return build_model(load_config("gemma-4-e2b", tiny=True), seed=0)


def _straddling_model():
    """6 q / 3 kv heads: at tp 2 each rank's queries straddle a KV group."""
    text = tiny_config_dict(load_config_dict("gemma-4-e4b"))
    text.update(num_attention_heads=6, num_key_value_heads=3)
    return build_model(family_for(text["model_type"]).make_config(text), seed=0)


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
    assert INPUT_NAMES == StepInputs._fields and len(INPUT_NAMES) == 8
    assert kv_aliases(4) == {8: 1, 9: 2, 10: 3, 11: 4}


# ---- ranks -----------------------------------------------------------------------------------
def test_every_rank_carries_the_one_setup_and_its_shard():
    model = _straddling_model()
    setup = RankSetup.for_layout(describe(model), 2)
    seen = run_ranks(
        lambda rank: (rank.rank, rank.setup is setup, rank.local_kv_heads, sorted(rank.kv_expand)), setup, model, mode="threads"
    )
    assert [s[0] for s in seen] == [0, 1] and all(s[1] for s in seen)
    for rank, _, kv_heads, expanded in seen:
        assert kv_heads == setup.plan.local_kv_heads(rank)
        assert expanded == list(range(setup.layout.num_layers))  # every layer straddles: 3 q over 2 kv groups
    # the model itself is never sharded
    assert (
        family_for("gemma4_text")
        .attention_projections(family_for("gemma4_text").attention(family_for("gemma4_text").decoder_layers(model)[0]))["q"]
        .out_features
        == 6 * 16
    )


def test_the_kv_head_gather_is_passed_explicitly_and_is_load_bearing():
    model = _straddling_model()
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


# ---- one compile loop: port and artifact cannot drift ----------------------------------------
def test_a_compiled_artifact_and_a_compiled_port_take_the_same_decode_inputs_and_write_kv_alike(e2b, tmp_path):
    shape = PortShape(32, 64)
    port = Port.over_model(e2b, PortShape(shape.buckets, shape.kv_lens))
    port.compile(get_backend("cpu"))
    manifest = write_artifact(
        tmp_path / "art",
        e2b,
        {"kind": "shipped", "name": "gemma-4-e2b", "tiny": True, "seed": 0},
        RankSetup.for_layout(describe(e2b), 1),
        shape,
    )
    loaded = load_rank_port(tmp_path / "art", manifest, Rank(0, artifact_setup(tmp_path / "art", manifest), identity_reduce))
    assert port.runners.facts() == loaded.runners.facts() == manifest["runners"] == {"inplace_kv_writes": True}
    assert port.batch == loaded.batch == manifest["batch"] == 1
    tokens, positions = torch.tensor([41]), torch.tensor([23])
    ours, theirs = port.inputs.decode(tokens, positions, 64), loaded.inputs.decode(tokens, positions, 64)
    for name, a, b in zip(INPUT_NAMES, ours, theirs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    gen = torch.Generator().manual_seed(3)
    start = [torch.randn(t.shape, generator=gen) for t in port.inputs.new_store(1, port.kv_len)]
    for side in (port, loaded):
        store = KVStore.from_tensors(side.stores.largest, [t.clone() for t in start])
        before = [t.clone() for t in store]
        logits, after = run_step(side.runners.decode[64], side.inputs.decode(tokens, positions, 64), store)
        # in place: the returned store is the given one, changed only at the written slots
        assert all(a is b or a.data_ptr() == b.data_ptr() for a, b in zip(after, store, strict=True))
        assert any(not torch.equal(a, b) for a, b in zip(before, store, strict=True))
        side.logits = logits
    assert torch.allclose(port.logits, loaded.logits, atol=1e-5)


# ---- one generate entry point ----------------------------------------------------------------
def test_generate_gives_the_same_tokens_from_a_model_a_port_and_an_artifact(e2b, tmp_path):
    shape = PortShape(32, 64)
    want = reference_generate(e2b, PROMPT, 12)["tokens"]
    from_model = generate(e2b, GenerationRequest.greedy([PROMPT], 12), shape=shape)
    from_port = generate(Port.over_model(e2b, PortShape([32], [64])), GenerationRequest.greedy([PROMPT], 12))
    write_artifact(
        tmp_path / "art",
        e2b,
        {"kind": "shipped", "name": "gemma-4-e2b", "tiny": True, "seed": 0},
        RankSetup.for_layout(describe(e2b), 1),
        shape,
    )
    from_artifact = generate(tmp_path / "art", GenerationRequest.greedy([PROMPT], 12))
    assert from_model.tokens[0] == from_port.tokens[0] == from_artifact.tokens[0] == want
    assert from_model.per_rank_kv_cache_bytes == from_artifact.per_rank_kv_cache_bytes
    with pytest.raises(ValueError, match="disagrees"):
        generate(e2b, GenerationRequest.greedy([PROMPT], 4), setup=RankSetup.for_layout(describe(e2b), 1), tp=2)
    with pytest.raises(ValueError, match="planned for another layout"):
        generate(
            e2b,
            GenerationRequest.greedy([PROMPT], 4),
            setup=RankSetup.for_layout(describe(load_config("gemma-4-12b", tiny=True)), 1),
        )
    with pytest.raises(ValueError, match="brings its own"):
        generate(tmp_path / "art", GenerationRequest.greedy([PROMPT], 4), shape=shape)
    with pytest.raises(BucketError, match="longer than the largest prompt bucket"):
        generate(tmp_path / "art", GenerationRequest.greedy([list(range(40))], 4))


@pytest.mark.slow
def test_a_straddling_tp2_artifact_traces_its_gathers_and_all_reduce(tmp_path):
    """The gathers and the all-reduce end up inside the traced graphs each gloo rank saves."""
    model = _straddling_model()
    save_model_dir(model, tmp_path / "model")
    setup = RankSetup.for_layout(describe(model), 2)
    write_artifact(tmp_path / "art", model, {"kind": "dir", "path": str(tmp_path / "model")}, setup, PortShape(32, 64))
    got = generate(tmp_path / "art", GenerationRequest.greedy([PROMPT], 16))
    assert len(got.per_rank_kv_cache_bytes) == 2 and not got.rank_disagreement
    assert got.tokens[0] == reference_generate(model, PROMPT, 16)["tokens"]
