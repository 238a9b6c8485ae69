"""Speculative decoding in the one scheduler: prompt-lookup drafts verified by the port's verify graph give Hugging
Face's greedy tokens, with drafts really kept; an accepted length off by one does not."""

from __future__ import annotations

import pytest

from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.request import GenerationParams
from neuron_port.generation.request_state import TokenEvent
from neuron_port.generation.slots import SlotBatch
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config
from neuron_port.model.loading import build_model

PROMPTS = [[2, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [2, 9, 9, 9, 9, 9], [2, 30, 31, 32, 30, 31, 32, 30]]
NEW = [24, 30, 18]


def _speculate(port: Port, draft_tokens: int) -> tuple[list[list[int]], SlotBatch]:
    batch = SlotBatch(port, len(PROMPTS))
    tokens: list[list[int]] = [[] for _ in PROMPTS]
    outcomes = batch.admit([(p, GenerationParams(n), row) for row, (p, n) in enumerate(zip(PROMPTS, NEW, strict=True))])
    while True:
        for row, event in outcomes:
            assert isinstance(event, TokenEvent), event
            tokens[row].append(event.token_id)
        if not batch.active:
            return tokens, batch
        outcomes = batch.verify_step(batch.lookup_drafts(draft_tokens))


@pytest.fixture(scope="module")
def models():
    return build_model(load_config("gemma-4-e2b", tiny=True), seed=0), build_model(load_config("gemma-4-e2b", tiny=True),
                                                                                    seed=0)


def test_greedy_speculation_gives_hugging_faces_tokens(models):
    reference, model = models
    port = Port.over_model(model, PortShape([16], [64], draft_tokens=4))
    got, batch = _speculate(port, 4)
    assert got == [reference_generate(reference, p, n).tokens for p, n in zip(PROMPTS, NEW, strict=True)]
    assert batch.accepted > 0 and batch.drafted > batch.accepted  # drafts were kept, and some rejected


def test_an_off_by_one_in_the_accepted_length_is_caught(models, monkeypatch):
    reference, model = models
    port = Port.over_model(model, PortShape([16], [64], draft_tokens=4))
    original = SlotBatch._accept

    def one_too_far(self, slot, draft, logits, host_ms, graph_ms):
        out = original(self, slot, draft, logits, host_ms, graph_ms)
        if self.rows[slot] is not None and draft:
            self.positions[slot] += 1
        return out

    monkeypatch.setattr(SlotBatch, "_accept", one_too_far)
    got, _ = _speculate(port, 4)
    assert got != [reference_generate(reference, p, n).tokens for p, n in zip(PROMPTS, NEW, strict=True)]


def test_a_verify_step_needs_a_port_built_for_its_drafts(models):
    _, model = models
    batch = SlotBatch(Port.over_model(model, PortShape([16], [64], draft_tokens=2)), 1)
    batch.admit([(PROMPTS[0], GenerationParams(8), 0)])
    with pytest.raises(ValueError, match="needs a port built with draft_tokens >= 3"):
        batch.verify_step({0: [5, 6, 7]})
    position = int(batch.positions[0])
    (_, event), = batch.verify_step({0: []})  # no draft: a plain decode step
    assert isinstance(event, TokenEvent) and int(batch.positions[0]) == position + 1


def test_each_verify_steps_first_event_counts_what_was_drafted_and_kept(models):
    """The counts a server adds up: on each row's first event of a verify step, its draft's length and how many of
    the tokens the step emitted for it, from the first, equal the draft (counted here from the emitted tokens)."""
    _, model = models
    batch = SlotBatch(Port.over_model(model, PortShape([16], [64], draft_tokens=4)), len(PROMPTS))
    batch.admit([(p, GenerationParams(n), row) for row, (p, n) in enumerate(zip(PROMPTS, NEW, strict=True))])
    drafted = accepted = 0
    while batch.active:
        drafts = batch.lookup_drafts(4)
        owners = {slot: batch.owners[slot] for slot in batch.active}
        outcomes = batch.verify_step(drafts)
        for slot, owner in owners.items():
            events = [event for row, event in outcomes if row == owner]
            emitted = [event.token_id for event in events]
            kept = next((i for i, (a, b) in enumerate(zip(emitted, drafts[slot], strict=False)) if a != b),
                        min(len(emitted), len(drafts[slot])))
            assert (events[0].drafted, events[0].accepted) == (len(drafts[slot]), kept)
            assert all(event.drafted == event.accepted == 0 for event in events[1:])
            drafted, accepted = drafted + len(drafts[slot]), accepted + kept
    assert (batch.drafted, batch.accepted) == (drafted, accepted) and accepted > 0


def test_compiled_verify_graphs_give_hugging_faces_tokens(models):
    """The verify graphs traced by the cpu backend (TorchScript, rows written in place) for the batch's every row:
    the same greedy tokens, drafts kept."""
    from neuron_port.backends import get_backend

    reference, model = models
    port = Port.over_model(model, PortShape([16], [64], draft_tokens=4))
    port.compile(get_backend("cpu"), batch=len(PROMPTS))
    assert sorted(port.runners.verify) == [2, 3, 4, 5] and port.batch == len(PROMPTS)
    got, batch = _speculate(port, 4)
    assert got == [reference_generate(reference, p, n).tokens for p, n in zip(PROMPTS, NEW, strict=True)]
    assert batch.accepted > 0
