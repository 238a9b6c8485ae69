"""Scoring a prompt in the slot batch: every prompt token after the first gets its log-probability
given the tokens before it, from the port's own decode steps; compared with the log-softmax of
Hugging Face's forward over the same prompt, position by position."""

from __future__ import annotations

import pytest
import torch

from neuron_port.checks.oracle import reference_generate, teacher_forced_logits
from neuron_port.generation.offline import run_request
from neuron_port.generation.request import GenerationParams, GenerationRequest
from neuron_port.generation.request_state import PromptScores, TokenEvent
from neuron_port.generation.slots import SlotBatch
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape

PROMPT = [2, 17, 301, 44, 9, 120, 77, 5, 260, 31, 8, 400]
TOLERANCE = 1e-4  # fp32 on the tiny E2B: the decode steps' logits against one forward over the prompt


@pytest.fixture(scope="module")
def port(tiny_e2b):
    return Port.over_model(tiny_e2b, PortShape([16, 32], [48, 96]))


def _events(port, entries, slots: int = 3) -> dict[str, list]:
    """Every event of each owner in ``entries`` [(prompt, params, owner)], admitted together and run to the end."""
    batch = SlotBatch(port, slots)
    events: dict[str, list] = {owner: [] for _, _, owner in entries}
    for owner, event in batch.admit(entries):
        events[owner].append(event)
    while batch.active:
        for owner, event in batch.step():
            events[owner].append(event)
    assert not batch.active and len(batch.free) == slots
    return events


def _hf_prompt_logprobs(model, prompt) -> torch.Tensor:
    """[len(prompt) - 1, vocab] log-probabilities Hugging Face gives each position after the first."""
    with torch.no_grad():
        return torch.log_softmax(teacher_forced_logits(model, prompt).double(), dim=-1)[:-1]


def test_prompt_scores_are_hugging_faces_log_softmax_and_the_completion_is_unchanged(port, tiny_e2b):
    scored = GenerationParams(6, logprobs=1, prompt_logprobs=3)
    events = _events(port, [(PROMPT, scored, "scored"), (PROMPT, GenerationParams(6), "plain"),
                            ([2, 5, 6, 7], GenerationParams(4), "other")])
    scores, *tokens = events["scored"]
    assert isinstance(scores, PromptScores) and scores.finish_reason is None
    assert all(isinstance(ev, TokenEvent) for ev in tokens)
    want = _hf_prompt_logprobs(tiny_e2b, PROMPT)
    got = torch.tensor(scores.logprobs, dtype=torch.float64)
    targets = torch.tensor(PROMPT[1:])
    assert len(scores.logprobs) == len(PROMPT) - 1
    assert (got - want[torch.arange(len(targets)), targets]).abs().max() < TOLERANCE
    for position, top in enumerate(scores.top_logprobs):
        assert [t for t, _ in top] == torch.topk(want[position], 3).indices.tolist()
        assert max(abs(lp - float(want[position, t])) for t, lp in top) < TOLERANCE
    # the completion after a scored prompt is the one after a prefilled prompt, and Hugging Face's
    reference = reference_generate(tiny_e2b, PROMPT, 6).tokens
    assert [ev.token_id for ev in tokens] == [ev.token_id for ev in events["plain"]] == reference
    assert [ev.token_id for ev in events["other"]] == reference_generate(tiny_e2b, [2, 5, 6, 7], 4).tokens


def test_the_comparison_fails_when_the_scores_are_off_by_one_position(port, tiny_e2b):
    """The check above is not satisfied by any plausible numbers: scores read one position early
    (the logits that predict the token before) are far from Hugging Face's."""
    scores = _events(port, [(PROMPT, GenerationParams(1, prompt_logprobs=0), "scored")])["scored"][0]
    want = _hf_prompt_logprobs(tiny_e2b, PROMPT)
    shifted = want[torch.arange(1, len(PROMPT) - 1), torch.tensor(PROMPT[1:-1])]
    got = torch.tensor(scores.logprobs[1:], dtype=torch.float64)
    assert (got - shifted).abs().max() > 100 * TOLERANCE


def test_max_new_tokens_zero_scores_the_prompt_alone(port, tiny_e2b):
    prompt_only = GenerationParams(0, prompt_logprobs=0)
    events = _events(port, [(PROMPT, prompt_only, "a"), ([2], prompt_only, "b")])
    (scores,), (single,) = events["a"], events["b"]
    assert scores.finish_reason == "length" and len(scores.logprobs) == len(PROMPT) - 1
    assert single == PromptScores(single.row, (), (), "length")  # one token: nothing to score


def test_a_one_token_prompt_scores_nothing_and_then_generates(port, tiny_e2b):
    scores, *tokens = _events(port, [([2], GenerationParams(5, prompt_logprobs=2), "a")])["a"]
    assert scores.logprobs == () and scores.finish_reason is None
    assert [ev.token_id for ev in tokens] == reference_generate(tiny_e2b, [2], 5).tokens


def test_scoring_is_the_servers_and_zero_new_tokens_needs_scoring(port):
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        GenerationParams(0)
    with pytest.raises(ValueError, match="prompt_logprobs is the server's"):
        run_request(port, GenerationRequest([PROMPT], GenerationParams(2, prompt_logprobs=1)))
