"""A whole request through the one scheduler: rows that finish early leave the batch, the logits of every step
come back per row (NaN once a row has finished), and the timings add up."""

import math

import pytest
import torch

from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.logits import softcap
from neuron_port.generation.offline import run_request
from neuron_port.generation.request import GenerationParams, GenerationRequest
from neuron_port.generation.slots import SlotBatch
from neuron_port.graph.kv import KVWrite
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.layout import describe

PROMPTS = [[2, 11, 40, 7, 9, 300], [2, 5, 6]]


@pytest.fixture(scope="module")
def port(tiny_e2b):
    return Port.over_model(tiny_e2b, PortShape([8], [16, 32]))


def test_rows_leave_the_batch_when_they_finish_and_keep_their_own_logits(port, tiny_e2b):
    request = GenerationRequest(PROMPTS, [GenerationParams(12), GenerationParams(4)], keep_logits=True)
    spy = []
    original = SlotBatch.step

    def counted(batch):
        spy.append(len(batch.active))
        return original(batch)

    SlotBatch.step = counted
    try:
        got = run_request(port, request)
    finally:
        SlotBatch.step = original
    assert spy == [2, 2, 2] + [1] * 8  # the short row's slot is freed after its 4th token
    assert [len(t) for t in got.tokens] == [12, 4] and got.finish_reasons == ["length", "length"]
    assert len(got.step_logits) == 12 and all(step.shape == (2, tiny_e2b.config.vocab_size) for step in got.step_logits)
    assert all(torch.isnan(step[1]).all() for step in got.step_logits[4:])  # no logits for a finished row
    cap = describe(tiny_e2b).softcap
    for row, prompt in enumerate(PROMPTS):
        ref = reference_generate(tiny_e2b, prompt, len(got.tokens[row]))
        assert got.tokens[row] == ref.tokens
        ours = softcap(torch.stack([step[row] for step in got.step_logits[: len(ref.logits)]]), cap)
        theirs = torch.stack(ref.logits)
        assert (ours - theirs).abs().max() / theirs.abs().max() < 1e-4  # relative to the largest logit


def test_timings_and_kv_lengths_add_up(port):
    got = run_request(port, GenerationRequest.greedy([PROMPTS[0]], 20))
    assert got.decode_steps == len(got.step_kv_lens) == 19  # the prefill makes the first token
    assert got.step_kv_lens == [16] * (16 - 6) + [32] * 9 and got.kv_len == 32
    assert 0 < got.graph_s and 0 <= got.host_s and got.prefill_s > 0 and got.decode_s > 0
    assert math.isclose(got.host_s + got.graph_s, got.prefill_s + got.decode_s, rel_tol=0.5)


def test_a_batch_the_compiled_graphs_do_not_take_is_refused_before_any_work(port):
    port.runners.batch = 2
    try:
        with pytest.raises(Exception, match="compiled graphs take batch 2, found 1 prompts"):
            run_request(port, GenerationRequest.greedy([PROMPTS[0]], 4))
    finally:
        port.runners.batch = None


def test_graphs_over_one_store_take_it_whole_and_match_hugging_face(tiny_e2b):
    """The xla path's shape on the CPU: every graph takes the store at the largest KV length (a short decode step
    attends over its prefix inside the graph). A request admitted while another decodes, both past the first KV
    length and across the sliding window's ring, gives Hugging Face's tokens and logits, and every step is handed
    the whole store (a port of per-length stores hands a short step a prefix view: the spy sees 16 slots)."""
    port = Port.over_model(tiny_e2b, PortShape([8], [16, 32]), one_store=True)
    assert port.runners.one_store and {g.store.kv_len for g in port.graphs.decode.values()} == {32}
    handed: list[tuple[int, int]] = []  # (the step's KV length, the widest buffer it was handed)

    def spied(kv, runner):
        def run(*args):
            handed.append((kv, max(t.shape[2] for t in args[len(args) - 2 * len(port.stores.largest.slots):])))
            return runner(*args)
        return run

    port.runners.decode = {kv: spied(kv, runner) for kv, runner in port.runners.decode.items()}
    batch, cap = SlotBatch(port, 2, keep_logits=True), describe(tiny_e2b).softcap
    params = [GenerationParams(18), GenerationParams(14)]
    tokens: dict[int, list[int]] = {0: [], 1: []}
    logits: dict[int, list[torch.Tensor]] = {0: [], 1: []}

    def note(outcomes):
        for owner, event in outcomes:
            tokens[owner].append(event.token_id)
        for slot, row in batch.last.logits.items():  # request r holds slot r: the lowest free one when it came
            logits[slot].append(row)

    note(batch.admit([(PROMPTS[0], params[0], 0)]))
    for _ in range(5):
        note(batch.step())
    note(batch.admit([(PROMPTS[1], params[1], 1)]))
    while batch.active:
        note(batch.step())
    for owner, prompt in enumerate(PROMPTS):
        ref = reference_generate(tiny_e2b, prompt, params[owner].max_new_tokens)
        assert tokens[owner] == ref.tokens
        ours = softcap(torch.stack(logits[owner][: len(ref.logits)]), cap)
        theirs = torch.stack(ref.logits)
        assert (ours - theirs).abs().max() / theirs.abs().max() < 1e-4  # relative to the largest logit
    widest = max(slot.slots for slot in port.stores.largest.slots)
    assert {kv for kv, _ in handed} == {16, 32} and {width for _, width in handed} == {widest}


class _RowsAsADevice:
    """A graph compiler that compiles nothing: each graph runs as built, at a fixed batch, writing its new rows as
    a device that aliases the store does (the xla backend's contract, on the CPU)."""

    name, kv_write, fixed_batch, inference_mode, leading_update = "rows-as-a-device", KVWrite.ROWS, True, True, None

    def compile(self, graph, example_inputs, aliases):
        with torch.no_grad():
            graph(*example_inputs)  # the example shapes the compile loop chose must be the graph's
        return graph


def test_decode_by_occupancy_over_one_store_runs_the_row_graphs_on_the_whole_store(tiny_e2b, monkeypatch):
    """Compiled for 2 rows over one store, the port also carries 1-row decode graphs that take the whole store and
    read and write its first row: a lone request runs them, a pair the 2-row ones, each request Hugging Face's
    tokens, the sliding window's ring wrapped and a second KV length reached."""
    from tests.helpers import record_decode_rows, run_slot_schedule

    port = Port.over_model(tiny_e2b, PortShape([8], [16, 32]), one_store=True)
    port.compile(_RowsAsADevice(), batch=2)
    assert sorted(port.runners.decode_rows) == [1] and port.runners.one_store
    assert {g.rows for g in port.runners.decode_rows[1].values()} == {1}
    used = record_decode_rows(monkeypatch.setattr)
    alone = run_slot_schedule(port, [(0, PROMPTS[0], GenerationParams(20))], 2)[0]
    assert alone == reference_generate(tiny_e2b, PROMPTS[0], 20).tokens and set(used) == {1}
    used.clear()
    pair = run_slot_schedule(port, [(0, PROMPTS[0], GenerationParams(20)), (3, PROMPTS[1], GenerationParams(16))], 2)
    assert [pair[0], pair[1]] == [reference_generate(tiny_e2b, p, n).tokens for p, n in zip(PROMPTS, (20, 16), strict=True)]
    assert set(used) == {1, 2}
