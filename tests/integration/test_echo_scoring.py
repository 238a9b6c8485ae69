"""Echo with prompt log-probabilities, as lm-evaluation-harness asks for them, against the served real
SmolLM2-135M in fp32: every prompt token's log-probability (the first's null) equals the log-softmax
of transformers' own forward over the same prompt, and a batched token-list request answers each
prompt as that prompt alone."""

from __future__ import annotations

import httpx
import pytest
import torch

from neuron_port.checks.reference import hf_reference_model
from tests.helpers import ServerProcess

pytestmark = pytest.mark.slow
TEXTS = ["The capital of France is Paris", "Water boils at a temperature of one hundred degrees",
         "The quick brown fox jumps over the lazy dog"]
TOLERANCE = 1e-4  # fp32: the port's decode logits against one forward over the prompt (measured ~1e-5)


@pytest.fixture(scope="module")
def served(smollm2_dir):
    server = ServerProcess(str(smollm2_dir), "--max-batch", "4", timeout=300)
    yield server, smollm2_dir.name
    server.stop()


@pytest.fixture(scope="module")
def prompts(smollm2_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return [tokenizer(text)["input_ids"] for text in TEXTS]


def _complete(served, **body) -> dict:
    server, model = served
    reply = httpx.post(server.base + "/v1/completions", json={"model": model, "temperature": 0, **body}, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _hf_logprobs(directory, prompt: list[int]) -> torch.Tensor:
    """[len(prompt)] log-probability transformers gives each prompt token after the first (NaN for the first)."""
    with torch.no_grad():
        logits = hf_reference_model(directory)(torch.tensor([prompt])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return torch.cat([torch.tensor([float("nan")], dtype=torch.float64), logp[torch.arange(len(prompt) - 1), prompt[1:]]])


def test_echoed_prompt_logprobs_are_transformers_log_softmax(served, prompts, smollm2_dir):
    for prompt in prompts:
        body = _complete(served, prompt=prompt, echo=True, logprobs=1, max_tokens=1)
        choice, = body["choices"]
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt) + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        want = _hf_logprobs(smollm2_dir, prompt)
        got = torch.tensor(lp["token_logprobs"][1:len(prompt)], dtype=torch.float64)
        assert (got - want[1:]).abs().max() < TOLERANCE, (got - want[1:]).abs().max()
        # the text is the prompt's and the completion's, and the offsets index it
        assert choice["text"] == "".join(lp["tokens"])
        assert all(choice["text"][off:].startswith(tok) for tok, off in zip(lp["tokens"], lp["text_offset"], strict=True))
        assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}
        # lm-eval's greedy check reads the top alternative: the model's own argmax after the prompt's tokens
        top = [max(alternatives.values()) for alternatives in lp["top_logprobs"][1:len(prompt)]]
        assert all(t >= g - 1e-12 for t, g in zip(top, got.tolist(), strict=True))


def test_max_tokens_zero_scores_the_prompt_alone(served, prompts, smollm2_dir):
    prompt = prompts[1]
    choice, = _complete(served, prompt=prompt, echo=True, logprobs=0, max_tokens=0)["choices"]
    assert choice["finish_reason"] == "length" and len(choice["logprobs"]["token_logprobs"]) == len(prompt)
    got = torch.tensor(choice["logprobs"]["token_logprobs"][1:], dtype=torch.float64)
    assert (got - _hf_logprobs(smollm2_dir, prompt)[1:]).abs().max() < TOLERANCE
    # echo alone: the prompt's text and the completion, no log-probabilities
    plain, = _complete(served, prompt=prompt, echo=True, max_tokens=3)["choices"]
    bare, = _complete(served, prompt=prompt, max_tokens=3)["choices"]
    assert plain["logprobs"] is None and plain["text"] == choice["text"] + bare["text"]


def test_a_batched_token_list_request_answers_each_prompt_as_alone(served, prompts):
    body = {"echo": True, "logprobs": 2, "max_tokens": 2}
    together = _complete(served, prompt=prompts, **body)["choices"]
    alone = [_complete(served, prompt=prompt, **body)["choices"][0] for prompt in prompts]
    assert [c["index"] for c in together] == [0, 1, 2]
    for a, b in zip(together, alone, strict=True):
        # the same text, tokens, offsets and alternatives; log-probabilities within float noise (the eager
        # prefill's batch is the prompts admitted together, and matrix kernels sum by batch size)
        def rest(choice):
            return {k: v for k, v in choice.items() if k not in ("index", "logprobs")}

        assert rest(a) == rest(b)
        la, lb = a["logprobs"], b["logprobs"]
        assert (la["tokens"], la["text_offset"]) == (lb["tokens"], lb["text_offset"])
        assert [list(t or {}) for t in la["top_logprobs"]] == [list(t or {}) for t in lb["top_logprobs"]]
        values = [(x, y) for x, y in zip(la["token_logprobs"], lb["token_logprobs"], strict=True) if x is not None]
        values += [(t[k], u[k]) for t, u in zip(la["top_logprobs"], lb["top_logprobs"], strict=True) if t for k in t]
        assert max(abs(x - y) for x, y in values) < TOLERANCE


@pytest.mark.parametrize("body,words", [
    ({"echo": True, "stream": True, "max_tokens": 2}, "echo is not served with stream: true"),
    ({"max_tokens": 0}, "max_tokens 0 scores the prompt alone and needs echo: true"),
])
def test_what_echo_cannot_do_is_refused_in_one_line(served, body, words):
    server, model = served
    reply = httpx.post(server.base + "/v1/completions", json={"model": model, "prompt": [1, 2, 3], **body}, timeout=60)
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]
    chat = httpx.post(server.base + "/v1/chat/completions", timeout=60,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "echo": True})
    assert chat.status_code == 400 and "'echo' is not supported" in chat.json()["error"]["message"]
