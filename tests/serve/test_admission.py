"""What a completion request's body may say, checked before anything is queued: the prompt forms the
OpenAI API allows, and the rules of echo and max_tokens 0 (scoring a prompt)."""

import pytest
from pydantic import ValidationError

pytest.importorskip("fastapi")

from neuron_port.serve.admission import _prompt_logprobs, prompt_forms, scores_prompts  # noqa: E402
from neuron_port.serve.schemas import CompletionRequest  # noqa: E402


@pytest.mark.parametrize("prompt,forms", [
    ("hi", ["hi"]), ([5, 6, 7], [[5, 6, 7]]), (["a", "b"], ["a", "b"]), ([[1, 2], [3]], [[1, 2], [3]]), ([], [[]]),
])
def test_each_prompt_form_gives_its_prompts(prompt, forms):
    assert prompt_forms(prompt) == forms
    assert prompt_forms(CompletionRequest(model="m", prompt=prompt).prompt) == forms


@pytest.mark.parametrize("body,words", [
    ({"max_tokens": 0}, "max_tokens 0 scores the prompt alone and needs echo: true"),
    ({"echo": True, "stream": True}, "echo is not served with stream: true"),
    ({"max_tokens": -1}, "greater than or equal to 0"),
])
def test_what_echo_cannot_do_is_refused(body, words):
    with pytest.raises(ValidationError, match=words):
        CompletionRequest(model="m", prompt="hi", **body)


def test_echo_scores_the_prompt_only_when_asked_or_when_nothing_is_generated():
    assert CompletionRequest(model="m", prompt=[1, 2], echo=True, max_tokens=0).max_tokens == 0
    assert _prompt_logprobs(False, 3, 5) is None
    assert _prompt_logprobs(True, 3, 5) == 3  # echo with logprobs: the prompt's, with 3 alternatives
    assert _prompt_logprobs(True, None, 5) is None  # echo alone: the prompt's text, nothing scored
    assert _prompt_logprobs(True, None, 0) == 0  # the prompt alone: scored, to have something to run


def test_which_requests_score_their_prompts():
    def body(**fields):
        return CompletionRequest(model="m", prompt=[1, 2], **fields)

    assert scores_prompts(body(echo=True, logprobs=0)) and scores_prompts(body(echo=True, max_tokens=0))
    assert not scores_prompts(body(echo=True)) and not scores_prompts(body(logprobs=2))


def test_an_unset_max_tokens_runs_a_chat_to_the_context_and_a_completion_to_16():
    """As OpenAI and vLLM: a chat completion without max_tokens may fill the context (it stops at its end of
    turn), a legacy completion stops after 16 tokens; either is cut to the room the prompt leaves."""
    from types import SimpleNamespace

    from neuron_port.serve.admission import DEFAULT_MAX_TOKENS, _max_tokens
    from neuron_port.serve.schemas import ChatRequest

    served = SimpleNamespace(kv_len=64)
    chat = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    completion = CompletionRequest(model="m", prompt=[1, 2])
    assert _max_tokens(served, chat, 10, chat=True) == 54
    assert _max_tokens(served, completion, 10, chat=False) == DEFAULT_MAX_TOKENS == 16
    assert _max_tokens(served, completion, 60, chat=False) == 4
    assert _max_tokens(served, ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5), 10,
                       chat=True) == 5
