"""Continuous batching: requests join free slots at step boundaries, leave when done, and get the
same tokens as when they run alone, whatever else shares the batch and whenever it arrived."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port import load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.request import GenerationParams
from neuron_port.generation.request_state import TokenEvent
from neuron_port.generation.sampling import SamplingParams
from neuron_port.generation.slots import SlotBatch
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model
from neuron_port.serve.engine import Engine, Submission

SLOTS = 3


@pytest.fixture(scope="module")
def port():
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    return Port.over_model(model, PortShape([16, 32], [48, 96])), model


def _run(port, schedule) -> dict[int, list[int]]:
    """Drive a SlotBatch by hand: ``schedule`` = [(arrival step, prompt, params)]; tokens per request."""
    batch = SlotBatch(port, SLOTS)
    tokens: dict[int, list[int]] = {i: [] for i in range(len(schedule))}
    waiting, step, done = [], 0, set()
    while len(done) < len(schedule):
        waiting += [i for i, (arrive, _, _) in enumerate(schedule) if arrive == step]
        take, waiting = waiting[: len(batch.free)], waiting[len(batch.free):]
        outcomes = batch.admit([(schedule[i][1], schedule[i][2], i) for i in take]) + batch.step()
        for owner, event in outcomes:
            assert isinstance(event, TokenEvent), event
            tokens[owner].append(event.token_id)
            if event.finish_reason is not None:
                done.add(owner)
        step += 1
        assert step < 500
    return tokens


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
    together = _run(port, schedule)
    for i, (_, prompt, params) in enumerate(schedule):
        alone = _run(port, [(0, prompt, params)])[0]
        assert together[i] == alone, f"request {i}"
        assert len(alone) == params.max_new_tokens


def test_a_solo_run_is_hugging_face_generate(port):
    port, model = port
    prompt = [2] + list(range(40, 60))
    assert _run(port, [(0, prompt, GenerationParams(20))])[0] == reference_generate(model, prompt, 20)["tokens"]


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
    solo = {i: _run(port, [(0, p, g)])[0] for i, (_, p, g) in enumerate(schedule) if i != 1}
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


def test_a_short_request_overtakes_a_long_one_through_the_engine(port):
    port = port[0]
    engine = Engine(port, slots=SLOTS)
    order, tokens, done = [], {"long": [], "short": []}, threading.Event()

    def listen(name):
        def on_event(event):
            if event is None:
                order.append(name)
                if len(order) == 2:
                    done.set()
            elif not isinstance(event, BaseException):
                tokens[name].append(event.token_id)
        return on_event

    short = ([2, 30, 31, 32], GenerationParams(5))
    engine.submit(Submission([2, 10, 11, 12, 13], GenerationParams(80), listen("long")))
    time.sleep(0.05)
    engine.submit(Submission(short[0], short[1], listen("short")))
    assert done.wait(120)
    engine.close()
    assert order == ["short", "long"] and len(tokens["long"]) == 80
    assert tokens["short"] == _run(port, [(0, *short)])[0]


def test_compiled_graphs_take_their_own_batch_as_slots(port):
    from neuron_port.backends import get_backend

    port, model = port
    compiled = Port.over_model(model, PortShape([16], [48]))
    compiled.compile(get_backend("cpu"), batch=2)
    with pytest.raises(Exception, match="batch 2"):
        SlotBatch(compiled, 3)
    prompt = [2, 9, 8, 7]
    got = _run_slots(compiled, 2, [(0, prompt, GenerationParams(6))])
    assert got == reference_generate(model, prompt, 6)["tokens"]


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
    together = _run(compiled, schedule)
    for i, (_, prompt, params) in enumerate(schedule):
        assert together[i] == _run(compiled, [(0, prompt, params)])[0], f"request {i}"
    assert together[0] == reference_generate(model, schedule[0][1], 10)["tokens"]


def test_the_engine_survives_a_broken_callback_and_reports_a_fatal_round(port):
    port = port[0]
    engine = Engine(port, slots=SLOTS)
    got, done = [], threading.Event()

    def broken(event):
        raise RuntimeError("the client's loop is gone")

    def fine(event):
        if event is None:
            done.set()
        elif not isinstance(event, BaseException):
            got.append(event.token_id)

    engine.submit(Submission([2, 5, 6], GenerationParams(6), broken))
    engine.submit(Submission([2, 9, 9], GenerationParams(6), fine))
    assert done.wait(60) and len(got) == 6 and engine.error is None
    engine.close()

    class Doomed(Engine):  # the device fails in the middle of a round, after taking a request
        def _round(self):
            self._new = self._take(1, block=True)
            raise RuntimeError("the device is gone")

    fatal = Doomed(port, slots=SLOTS)
    heard, failed = [], threading.Event()
    fatal.submit(Submission([2, 5], GenerationParams(4), lambda e: (heard.append(e), failed.set())))
    assert failed.wait(30) and len(heard) == 1 and isinstance(heard[0], RuntimeError)
    assert fatal.error == "RuntimeError: the device is gone"
    with pytest.raises(Exception, match="the engine stopped"):
        fatal.submit(Submission([2, 5], GenerationParams(4), lambda e: None))
