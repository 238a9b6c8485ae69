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

from neuron_port.errors import BucketError, Rejected
from neuron_port.generation.request import GenerationParams
from neuron_port.generation.sampling import SamplingParams
from neuron_port.graph.shapes import select_bucket
from neuron_port.serve.loading import Served
from neuron_port.serve.schemas import ChatRequest, CommonFields

DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class Admitted:
    """A checked request: its prompt ids and one parameter set per choice (``n``)."""

    prompt: list[int]
    choices: list[GenerationParams]
    logprobs: int | None


def _encoded(served: Served, text: str, param: str) -> list[int]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Rejected(400, f"{param} is not valid unicode text ({exc.reason} at position {exc.start})", param=param) from None
    try:
        return served.encode(text)
    except ValueError as exc:
        raise Rejected(400, str(exc), param=param) from None


def checked_prompt_ids(served: Served, body: CommonFields) -> list[int]:
    """The prompt as token ids, checked against the vocabulary and the buckets."""
    if body.model != served.model_id:
        raise Rejected(404, f"the model {body.model!r} does not exist; this server serves {served.model_id!r}",
                       "not_found_error", "model")
    if isinstance(body, ChatRequest):
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        try:
            text = served.chat.render(messages)
            text.encode("utf-8")
            ids = served.chat.encode_text(text, served.tokenizer, served.bos_id)
        except UnicodeEncodeError as exc:
            raise Rejected(400, f"messages is not valid unicode text ({exc.reason} at position {exc.start})",
                           param="messages") from None
        except ValueError as exc:
            raise Rejected(400, str(exc), param="messages") from None
    else:
        ids = list(body.prompt) if isinstance(body.prompt, list) else _encoded(served, body.prompt, "prompt")
    if not ids:
        raise Rejected(400, "the prompt is empty", param="prompt")
    bad = [t for t in ids if not 0 <= t < served.vocab_size]
    if bad:
        raise Rejected(400, f"token id {bad[0]} is outside the vocabulary (0..{served.vocab_size - 1})", param="prompt")
    try:
        select_bucket(len(ids), served.buckets)
    except BucketError as exc:
        raise Rejected(400, str(exc), param="prompt") from None
    return ids


def _max_tokens(served: Served, body: CommonFields, prompt_len: int) -> int:
    asked = getattr(body, "max_completion_tokens", None)
    param = "max_completion_tokens" if asked is not None else "max_tokens"
    room = served.kv_len - prompt_len
    if room < 1:
        raise Rejected(400, f"the prompt of {prompt_len} tokens fills the context of {served.kv_len} tokens: no room for "
                            "new tokens", param="prompt")
    wanted = asked if asked is not None else (body.max_tokens or min(DEFAULT_MAX_TOKENS, room))
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
    """Check a request and build its prompt and per-choice parameters (or raise :class:`Rejected`)."""
    ids = checked_prompt_ids(served, body)
    max_tokens = _max_tokens(served, body, len(ids))
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
    sampling = _sampling(served, body)
    choices = [GenerationParams(max_new_tokens=max_tokens, sampling=sampling, seed=(seed + i) % 2**64,
                                stop_token_ids=stop_ids, stop_strings=stops, logprobs=logprobs)
               for i in range(body.n)]
    return Admitted(ids, choices, logprobs)


__all__ = ["DEFAULT_MAX_TOKENS", "Admitted", "checked_prompt_ids", "admit"]
