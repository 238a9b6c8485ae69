"""Everything checked and built before a request joins a batch: prompt ids and generation parameters.

A request that would fail later — a token id outside the vocabulary, a prompt longer than the
largest bucket, more tokens asked for than the KV store holds, a lone surrogate the tokenizer
cannot encode, a stop string without a tokenizer — is refused here with a 4xx that names the
parameter, so nothing it carries can reach the engine and hurt the requests batched with it.
Plain functions, run off the event loop (tokenizing a long prompt takes time).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from neuron_port.errors import Rejected
from neuron_port.generation.request import GenerationParams
from neuron_port.generation.sampling import SamplingParams
from neuron_port.serve.loading import Served
from neuron_port.serve.schemas import ChatRequest, CommonFields

DEFAULT_MAX_TOKENS = 16
"""New tokens of a completion (``/v1/completions``) that names no ``max_tokens``, as OpenAI's legacy API and vLLM
default; a chat completion runs to the context instead, as both do."""


@dataclass(frozen=True)
class Admitted:
    """A checked request: every prompt's ids and, in the response's choice order, each choice's
    prompt and parameters (``n`` per prompt: choice ``p * n + i`` is prompt ``p``'s ``i``-th)."""

    prompts: list[list[int]]
    choices: list[tuple[list[int], GenerationParams]]
    logprobs: int | None
    echo: bool = False


def _encoded(served: Served, text: str, param: str) -> list[int]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Rejected(400, f"{param} is not valid unicode text ({exc.reason} at position {exc.start})", param=param) from None
    try:
        return served.encode(text)
    except ValueError as exc:
        raise Rejected(400, str(exc), param=param) from None


def _check_model(served: Served, body: CommonFields) -> None:
    if body.model != served.model_id:
        raise Rejected(404, f"the model {body.model!r} does not exist; this server serves {served.model_id!r}",
                       "not_found_error", "model")


def _chat_ids(served: Served, body: ChatRequest) -> list[int]:
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    try:
        text = served.chat.render(messages)
        text.encode("utf-8")
        return served.chat.encode_text(text, served.tokenizer, served.bos_id)
    except UnicodeEncodeError as exc:
        raise Rejected(400, f"messages is not valid unicode text ({exc.reason} at position {exc.start})",
                       param="messages") from None
    except ValueError as exc:
        raise Rejected(400, str(exc), param="messages") from None


def prompt_forms(prompt: str | list) -> list[str | list[int]]:
    """The prompts of a completion request's ``prompt``: one for a string or a flat id list, one per
    item for a list of strings or of id lists."""
    if isinstance(prompt, str) or not prompt or all(isinstance(t, int) for t in prompt):
        return [prompt]
    return list(prompt)


def _checked_ids(served: Served, ids: list[int], where: str, scored: bool = False) -> list[int]:
    if not ids:
        raise Rejected(400, f"{where} is empty", param="prompt")
    bad = [t for t in ids if not 0 <= t < served.vocab_size]
    if bad:
        raise Rejected(400, f"{where}: token id {bad[0]} is outside the vocabulary (0..{served.vocab_size - 1})",
                       param="prompt")
    if scored:  # only its first token is prefilled; the rest is fed one decode step each
        if len(ids) > served.kv_len:
            raise Rejected(400, f"{where} of {len(ids)} tokens is longer than the context of {served.kv_len} tokens",
                           param="prompt")
        return ids
    if len(ids) > max(served.buckets):
        raise Rejected(400, f"{where} of {len(ids)} tokens is longer than the largest prompt bucket ({max(served.buckets)}); "
                            "send a shorter prompt, or serve with a larger --buckets (an artifact: compile it with one)",
                       param="prompt")
    return ids


def scores_prompts(body: CommonFields) -> bool:
    """Whether the request's prompts are scored token by token (``echo`` with ``logprobs``, or
    ``max_tokens`` 0; :func:`_prompt_logprobs` says so): then a prompt may be as long as the context,
    not only as the largest bucket."""
    return _prompt_logprobs(bool(getattr(body, "echo", False)), getattr(body, "logprobs", None), body.max_tokens) is not None


def checked_prompts(served: Served, body: CommonFields) -> list[list[int]]:
    """Every prompt of the request as token ids, each checked against the vocabulary and the buckets
    (the context, for a prompt that is scored)."""
    _check_model(served, body)
    if isinstance(body, ChatRequest):
        return [_checked_ids(served, _chat_ids(served, body), "the prompt")]
    forms, scored = prompt_forms(body.prompt), scores_prompts(body)
    prompts = []
    for p, form in enumerate(forms):
        where = "the prompt" if len(forms) == 1 else f"prompt {p}"
        ids = list(form) if isinstance(form, list) else _encoded(served, form, "prompt")
        prompts.append(_checked_ids(served, ids, where, scored))
    return prompts


def _max_tokens(served: Served, body: CommonFields, prompt_len: int, chat: bool) -> int:
    asked = getattr(body, "max_completion_tokens", None)
    param = "max_completion_tokens" if asked is not None else "max_tokens"
    room = served.kv_len - prompt_len
    explicit = asked if asked is not None else body.max_tokens
    if room < 1 and explicit != 0:
        raise Rejected(400, f"the prompt of {prompt_len} tokens fills the context of {served.kv_len} tokens: no room for "
                            "new tokens", param="prompt")
    if explicit is None:  # a chat runs to the context (it stops at its end-of-turn), a completion to 16 tokens
        return room if chat else min(DEFAULT_MAX_TOKENS, room)
    wanted = explicit
    if prompt_len + wanted > served.kv_len:
        raise Rejected(400, f"{param} {wanted} with a prompt of {prompt_len} tokens exceeds the context of "
                            f"{served.kv_len} tokens (at most {served.kv_len - prompt_len} new tokens)", param=param)
    return wanted


def _sampling(served: Served, body: CommonFields) -> SamplingParams:
    bias = tuple((int(k), float(v)) for k, v in (body.logit_bias or {}).items())
    if any(not 0 <= token < served.vocab_size for token, _ in bias):
        raise Rejected(400, f"logit_bias names token ids outside the vocabulary (0..{served.vocab_size - 1})",
                       param="logit_bias")
    return SamplingParams(body.temperature, max(0, body.top_k), body.top_p, body.repetition_penalty,
                          body.presence_penalty, body.frequency_penalty, bias)


def admit(served: Served, body: CommonFields, chat: bool) -> Admitted:
    """Check a request and build its prompts and per-choice parameters (or raise :class:`Rejected`)."""
    prompts = checked_prompts(served, body)
    if len(prompts) * body.n > served.engine.max_queue:
        raise Rejected(400, f"{len(prompts)} prompts x n {body.n} = {len(prompts) * body.n} choices, more than the "
                            f"server queues at once ({served.engine.max_queue})", param="prompt")
    max_tokens = [_max_tokens(served, body, len(ids), chat) for ids in prompts]
    stops = () if body.stop is None else ((body.stop,) if isinstance(body.stop, str) else tuple(body.stop))
    if stops and served.tokenizer is None:
        raise Rejected(400, "stop strings need a tokenizer, and this model has none", param="stop")
    for stop in stops:
        _encoded(served, stop, "stop")
    stop_ids = () if body.ignore_eos else tuple(dict.fromkeys(served.eos_ids + (served.chat.stop_ids if chat else ())))
    seed = body.seed if body.seed is not None else secrets.randbits(63)  # no seed: a random one, as OpenAI's
    if isinstance(body, ChatRequest):
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    else:
        logprobs = body.logprobs
    echo = bool(getattr(body, "echo", False))
    sampling = _sampling(served, body)
    choices = [(ids, GenerationParams(max_new_tokens=wanted, sampling=sampling, seed=(seed + i) % 2**64,
                                      stop_token_ids=stop_ids, stop_strings=stops, logprobs=logprobs,
                                      prompt_logprobs=_prompt_logprobs(echo, logprobs, wanted)))
               for ids, wanted in zip(prompts, max_tokens, strict=True) for i in range(body.n)]
    return Admitted(prompts, choices, logprobs, echo)


def _prompt_logprobs(echo: bool, logprobs: int | None, max_tokens: int | None) -> int | None:
    """What the engine scores of an echoed prompt: its tokens' log-probabilities when the request asks
    for logprobs (or generates nothing, which is all a prompt-only request does); None otherwise."""
    if not echo:
        return None
    if logprobs is not None:
        return logprobs
    return 0 if max_tokens == 0 else None


__all__ = ["DEFAULT_MAX_TOKENS", "Admitted", "prompt_forms", "scores_prompts", "checked_prompts", "admit"]
