"""An artifact and the port it was compiled from take the same step inputs; a straddling tp 2 artifact keeps
its gathers and all-reduce."""


from __future__ import annotations

import pytest
import torch

from neuron_port import describe
from neuron_port.artifacts.reader import artifact_setup, load_rank_port
from neuron_port.artifacts.writer import write_artifact
from neuron_port.backends import get_backend
from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.kv import KVStore
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.graph.step import INPUT_NAMES, run_step
from neuron_port.model.loading import save_model_dir
from neuron_port.model.source import Source
from neuron_port.parallel.launch import identity_reduce
from neuron_port.parallel.ranks import Rank, RankSetup
from tests.helpers import straddling_model

PROMPT = [2, 17, 33, 5, 92, 41, 7, 300, 12, 58, 9, 77, 140, 3, 64, 211, 18, 25]


# ---- one compile loop: port and artifact cannot drift ----------------------------------------
def test_a_compiled_artifact_and_a_compiled_port_take_the_same_decode_inputs_and_write_kv_alike(tiny_e2b, tmp_path):
    shape = PortShape(32, 64)
    port = Port.over_model(tiny_e2b, PortShape(shape.buckets, shape.kv_lens))
    port.compile(get_backend("cpu"))
    manifest = write_artifact(
        tmp_path / "art",
        tiny_e2b,
        Source.shipped("gemma-4-e2b", tiny=True),
        RankSetup.for_layout(describe(tiny_e2b), 1),
        shape,
    )
    loaded = load_rank_port(tmp_path / "art", manifest, Rank(0, artifact_setup(tmp_path / "art", manifest), identity_reduce))
    assert port.runners.facts() == loaded.runners.facts() == manifest.runners == {"kv_write": "in_place", "decode_rows": []}
    assert port.batch == loaded.batch == manifest.batch == 1
    tokens, positions = torch.tensor([41]), torch.tensor([23])
    ours, theirs = port.inputs.decode(tokens, positions), loaded.inputs.decode(tokens, positions)
    for name, a, b in zip(INPUT_NAMES, ours, theirs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    gen = torch.Generator().manual_seed(3)
    start = [torch.randn(t.shape, generator=gen) for t in port.inputs.new_store(1, port.kv_len)]
    for side in (port, loaded):
        store = KVStore.from_tensors(side.stores.largest, [t.clone() for t in start])
        before = [t.clone() for t in store]
        logits, after = run_step(side.runners.decode[64], side.inputs.decode(tokens, positions), store)
        # in place: the returned store is the given one, changed only at the written slots
        assert all(a is b or a.data_ptr() == b.data_ptr() for a, b in zip(after, store, strict=True))
        assert any(not torch.equal(a, b) for a, b in zip(before, store, strict=True))
        side.logits = logits
    assert torch.allclose(port.logits, loaded.logits, atol=1e-5)


@pytest.mark.slow
def test_a_straddling_tp2_artifact_traces_its_gathers_and_all_reduce(tmp_path):
    """The gathers and the all-reduce end up inside the traced graphs each gloo rank saves."""
    model = straddling_model()
    save_model_dir(model, tmp_path / "model")
    setup = RankSetup.for_layout(describe(model), 2)
    write_artifact(tmp_path / "art", model, Source.directory(str(tmp_path / "model")), setup, PortShape(32, 64))
    got = generate(tmp_path / "art", GenerationRequest.greedy([PROMPT], 16))
    assert len(got.per_rank_kv_cache_bytes) == 2 and not got.rank_disagreement
    assert got.tokens[0] == reference_generate(model, PROMPT, 16).tokens
