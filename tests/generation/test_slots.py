"""Continuous batching: requests join free slots at step boundaries, leave when done, and get the
same tokens as when they run alone, whatever else shares the batch and whenever it arrived."""


from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.request import GenerationParams
from neuron_port.generation.sampling import SamplingParams
from neuron_port.generation.slots import SlotBatch
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from tests.helpers import run_slot_schedule

SLOTS = 3


@pytest.fixture(scope="module")
def port(tiny_e2b):
    return Port.over_model(tiny_e2b, PortShape([16, 32], [48, 96])), tiny_e2b


_request = st.tuples(
    st.integers(0, 12),  # arrival step
    st.lists(st.integers(3, 511), min_size=1, max_size=30),  # prompt (BOS added)
    st.integers(1, 14),  # new tokens
    st.sampled_from([0.0, 0.8]),  # greedy or sampled
)


@settings(max_examples=8)
@given(st.lists(_request, min_size=2, max_size=6))
def test_every_request_gets_its_solo_tokens_for_any_arrival_schedule(port, requests):
    port = port[0]
    schedule = [(arrive, [2] + body, GenerationParams(n, SamplingParams(temp, top_k=20), seed=i))
                for i, (arrive, body, n, temp) in enumerate(requests)]
    together = run_slot_schedule(port, schedule, SLOTS)
    for i, (_, prompt, params) in enumerate(schedule):
        alone = run_slot_schedule(port, [(0, prompt, params)], SLOTS)[0]
        assert together[i] == alone, f"request {i}"
        assert len(alone) == params.max_new_tokens


def test_a_solo_run_is_hugging_face_generate(port):
    port, model = port
    prompt = [2] + list(range(40, 60))
    alone = run_slot_schedule(port, [(0, prompt, GenerationParams(20))], SLOTS)[0]
    assert alone == reference_generate(model, prompt, 20).tokens


def test_a_failing_request_alone_ends(port, monkeypatch):
    """An error while advancing one row (here: injected for seed 13) fails that request only."""
    import neuron_port.generation.slots as continuous

    port = port[0]
    real = continuous.advance

    def flaky(row, *args):
        if row.params.seed == 13 and len(row.tokens) == 3:
            raise RuntimeError("injected")
        return real(row, *args)

    schedule = [(0, [2, 5, 9, 11], GenerationParams(8, seed=1)), (0, [2, 7, 7], GenerationParams(8, seed=13)),
                (1, [2, 40, 41, 42], GenerationParams(8, seed=2))]
    solo = {i: run_slot_schedule(port, [(0, p, g)], SLOTS)[0] for i, (_, p, g) in enumerate(schedule) if i != 1}
    monkeypatch.setattr(continuous, "advance", flaky)
    batch, seen, failed = SlotBatch(port, SLOTS), {0: [], 2: []}, []
    outcomes = batch.admit([(p, g, i) for i, (a, p, g) in enumerate(schedule) if a == 0]) + batch.step()
    outcomes += batch.admit([(schedule[2][1], schedule[2][2], 2)])
    while batch.active:
        outcomes += batch.step()
    for owner, event in outcomes:
        if isinstance(event, BaseException):
            failed.append((owner, str(event)))
        elif owner != 1:
            seen[owner].append(event.token_id)
    assert failed == [(1, "injected")]
    assert seen == solo


def test_compiled_graphs_take_their_own_batch_as_slots(port):
    from neuron_port.backends import get_backend

    port, model = port
    compiled = Port.over_model(model, PortShape([16], [48]))
    compiled.compile(get_backend("cpu"), batch=2)
    with pytest.raises(Exception, match="batch 2"):
        SlotBatch(compiled, 3)
    prompt = [2, 9, 8, 7]
    got = _run_slots(compiled, 2, [(0, prompt, GenerationParams(6))])
    assert got == reference_generate(model, prompt, 6).tokens


def _run_slots(port, slots, schedule):
    batch = SlotBatch(port, slots)
    out = batch.admit([(p, g, i) for i, (_, p, g) in enumerate(schedule)])
    while batch.active:
        out += batch.step()
    return [ev.token_id for _, ev in out]


def test_kv_rows_of_other_slots_are_untouched_by_an_admission(port):
    port = port[0]
    batch = SlotBatch(port, SLOTS)
    batch.admit([([2, 5, 6, 7], GenerationParams(20), "a")])
    batch.step()
    before = [t[0].clone() for t in batch.store]
    batch.admit([([2, 9, 9, 9, 9], GenerationParams(5), "b")])
    after = [t[0] for t in batch.store]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_compiled_slots_admit_while_others_decode_and_reuse_freed_slots(port):
    """Compiled graphs prefill over every slot's row: the empty rows must write nothing there."""
    from neuron_port.backends import get_backend

    _, model = port
    compiled = Port.over_model(model, PortShape([16, 32], [48, 96]))
    compiled.compile(get_backend("cpu"), batch=SLOTS)
    schedule = [(0, [2, 5, 9], GenerationParams(10)), (0, [2, 40, 41, 42, 43], GenerationParams(3)),
                (2, [2, 7, 7, 7], GenerationParams(12)), (3, [2, 100, 101], GenerationParams(6)),
                (4, [2, 60] + list(range(61, 80)), GenerationParams(8, SamplingParams(0.8, top_k=20), seed=5))]
    together = run_slot_schedule(compiled, schedule, SLOTS)
    for i, (_, prompt, params) in enumerate(schedule):
        assert together[i] == run_slot_schedule(compiled, [(0, prompt, params)], SLOTS)[0], f"request {i}"
    assert together[0] == reference_generate(model, schedule[0][1], 10).tokens


def test_a_request_crossing_a_kv_length_decodes_short_then_long_as_hugging_face_does(port, monkeypatch):
    """Steps decode at the shortest KV length holding every active slot (a prefix of the one store):
    48 while the positions fit, then 96; the tokens stay Hugging Face's."""
    import neuron_port.generation.slots as continuous

    port, model = port
    lengths = []
    chosen = continuous.SlotBatch.decode_length
    monkeypatch.setattr(continuous.SlotBatch, "decode_length",
                        lambda self, active: lengths.append(chosen(self, active)) or lengths[-1])
    prompt = [2] + list(range(100, 130))  # 31 tokens: positions 31..60 cross 48
    alone = run_slot_schedule(port, [(0, prompt, GenerationParams(30))], SLOTS)[0]
    assert alone == reference_generate(model, prompt, 30).tokens
    assert lengths[0] == 48 and lengths[-1] == 96 and lengths == sorted(lengths)


def _rows_used(monkeypatch) -> list[int]:
    from tests.helpers import record_decode_rows

    return record_decode_rows(monkeypatch.setattr)


def test_a_lone_request_decodes_on_the_one_row_graph_of_a_compiled_port(port, monkeypatch):
    """Decode by occupancy: a compiled 4-slot port carries decode graphs for 1 and 2 rows; a request alone runs the
    1-row graph, two run the 2-row one, and a second request whose neighbour in slot 0 finished keeps the
    rows up to its slot. Every request's tokens stay Hugging Face's."""
    from neuron_port.backends import get_backend

    _, model = port
    compiled = Port.over_model(model, PortShape([16, 32], [48, 96]))
    compiled.compile(get_backend("cpu"), batch=4)
    assert sorted(compiled.runners.decode_rows) == [1, 2]
    used = _rows_used(monkeypatch)
    prompt = [2, 5, 9, 11]
    assert run_slot_schedule(compiled, [(0, prompt, GenerationParams(12))], 4)[0] == reference_generate(model, prompt, 12).tokens
    assert set(used) == {1}
    used.clear()
    schedule = [(0, [2, 40, 41], GenerationParams(3)), (0, [2, 7, 7, 7], GenerationParams(10))]
    together = run_slot_schedule(compiled, schedule, 4)
    assert together[1] == reference_generate(model, schedule[1][1], 10).tokens
    assert used[0] == 2 and used[-1] == 2  # slot 1 alone at the end: the rows up to it


def test_decode_by_occupancy_writes_its_rows_back_or_the_tokens_go_wrong(port, monkeypatch):
    """Eager graphs decode exactly the occupied rows on views of the store and copy their answer back; a planted
    fault that drops that copy makes a lone request's tokens differ from Hugging Face's (the check would catch a
    step that lost its rows)."""
    from neuron_port.graph.kv import KVStore

    port, model = port
    used = _rows_used(monkeypatch)
    prompt = [2, 5, 9, 11, 300]
    expected = reference_generate(model, prompt, 10).tokens
    assert run_slot_schedule(port, [(0, prompt, GenerationParams(10))], SLOTS)[0] == expected
    assert set(used) == {1}  # one row of three
    monkeypatch.setattr(KVStore, "write_prefix", lambda self, answer: None)
    assert run_slot_schedule(port, [(0, prompt, GenerationParams(10))], SLOTS)[0] != expected
