"""One accepted request's answer: the engine's events for its ``n`` choices, as an OpenAI response.

Whole responses collect every choice; streamed ones send one server-sent event per token (with
its choice index), a usage chunk when ``stream_options.include_usage`` asks for it (and the usage
so far in every chunk with ``continuous_usage_stats``, as vLLM sends it), and ``data: [DONE]``. A
choice that fails ends the request with an OpenAI error object — or, once a stream has started,
an SSE ``error`` event followed by ``[DONE]``. Log-probabilities come in
OpenAI's two shapes: ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset`` for
completions, ``content: [{token, logprob, bytes, top_logprobs}]`` for chat; a token's text is
what it adds to the text before it (decoded in a short window of context, so leading spaces
survive), and ``text_offset`` counts those texts. With ``echo`` a completion's text starts with the
prompt's, and its log-probabilities with the prompt tokens' (the first one's ``null``, as OpenAI and
vLLM give it), all from the engine's :class:`PromptScores`.

Each token's time (stamped by the engine when it was made) feeds the time-to-first-token and
inter-token histograms. A client that leaves a whole response before it is ready gets a quiet 499
(nginx's "client closed request"; nobody reads it) and its choices stop.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse

from neuron_port.errors import ClientGone
from neuron_port.generation.request_state import CONTEXT_TOKENS, PromptScores, TokenEvent
from neuron_port.serve.engine import Submission
from neuron_port.serve.loading import Served
from neuron_port.serve.metrics import Metrics


def error_body(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse(status_code=status, content=error_body(status, message, kind, param), headers=headers)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


DISCONNECT_POLL_S = 1.0
CLIENT_CLOSED = 499
USAGE_CHUNKS = ("none", "last", "every")


class Reply:
    """The events of a request's choices (one engine request each), turned into its response."""

    def __init__(self, served: Served, metrics: Metrics, chat: bool, requests: list[Submission], queue: asyncio.Queue,
                 prompts: list[list[int]], logprobs: int | None, with_ids: bool, usage_chunks: str = "none",
                 echo: bool = False, arrived: float | None = None):
        if usage_chunks not in USAGE_CHUNKS:
            raise ValueError(f"usage_chunks must be one of {USAGE_CHUNKS}, found {usage_chunks!r}")
        self.served, self.metrics, self.chat, self.requests, self.queue = served, metrics, chat, requests, queue
        self.prompt_tokens = sum(len(p) for p in prompts)  # each prompt once, whatever its n
        self.logprobs, self.with_ids, self.usage_chunks, self.echo = logprobs, with_ids, usage_chunks, echo
        self.told = [0] * len(requests)  # tokens seen per choice
        self.drafted = [0] * len(requests)  # speculative decoding, per choice: drafted tokens checked
        self.accepted = [0] * len(requests)  # and those the target emitted
        self.context = [list(req.prompt[-CONTEXT_TOKENS:]) for req in requests]  # per choice, for token texts
        self.offsets = [0] * len(requests)
        self.rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.started = time.monotonic() if arrived is None else arrived

    def usage(self, n: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}

    def cancel(self, client_left: bool = True) -> None:
        """Stop every choice (the client went away, or a sibling choice failed)."""
        for req in self.requests:
            req.cancelled.set()
        if client_left:
            self.metrics.add("cancelled", 1)

    async def events(self, disconnected: Any = None) -> AsyncIterator[tuple[int, TokenEvent | PromptScores]]:
        """(choice index, event) until every choice is done; an exception that ended a choice is raised
        (its siblings are stopped). ``disconnected``: an async check, polled while waiting."""
        open_choices, checked = len(self.requests), time.monotonic()
        while open_choices:
            try:
                index, ev = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                index, ev = None, None
            if disconnected is not None and time.monotonic() - checked >= DISCONNECT_POLL_S:
                checked = time.monotonic()
                if await disconnected():
                    self.cancel()
                    raise ClientGone("the client went away")
            if index is None:
                continue
            if ev is None:
                open_choices -= 1
                self.metrics.observe_acceptance(self.drafted[index], self.accepted[index])
                continue
            if isinstance(ev, BaseException):
                self.cancel(client_left=False)
                raise ev
            if isinstance(ev, TokenEvent):
                self._time_token(index)
                self._count_drafts(index, ev)
            yield index, ev

    def _count_drafts(self, index: int, ev: TokenEvent) -> None:
        """A verify step's drafted and accepted tokens (on its first event), into the choice's totals and the
        server's counters."""
        if ev.drafted:
            self.drafted[index] += ev.drafted
            self.accepted[index] += ev.accepted
            self.metrics.speculated(ev.drafted, ev.accepted)

    def _time_token(self, index: int) -> None:
        """Observe the time to this choice's first token, or since its previous one, from the engine's stamps."""
        k, stamps = self.told[index], getattr(self.requests[index], "token_times", ())
        self.told[index] += 1
        if k >= len(stamps):
            return
        if k == 0:
            self.metrics.observe_token("ttft", stamps[0] - self.started)
        else:
            self.metrics.observe_token("itl", stamps[k] - stamps[k - 1])

    # ---- log-probabilities ------------------------------------------------------------------
    def _text_of(self, context: list[int], token_id: int) -> str:
        """What ``token_id`` adds to the text of ``context``."""
        tok = self.served.tokenizer
        if tok is None:
            return str(token_id)
        before = tok.decode(context)
        after = tok.decode(context + [token_id])
        return after[len(before):] if after.startswith(before) else tok.decode([token_id])

    def _entry(self, index: int, token_id: int, top_logprobs) -> tuple[str, list[tuple[str, float]], int]:
        """A token's text, its alternatives' texts with log-probabilities, and its text offset, in the
        choice's running context; advances the context and the offset."""
        context = self.context[index]
        text = self._text_of(context, token_id)
        alternatives = [(self._text_of(context, t), lp) for t, lp in top_logprobs]
        offset = self.offsets[index]
        self.offsets[index] += len(text)
        self.context[index] = (context + [token_id])[-CONTEXT_TOKENS:]
        return text, alternatives, offset

    def _logprob_entries(self, index: int, ev: TokenEvent) -> tuple[str, list[tuple[str, float]], int]:
        return self._entry(index, ev.token_id, ev.top_logprobs)

    def _echoed_prompt(self, index: int, scores: PromptScores | None) -> tuple[str, dict | None]:
        """The prompt's text and, when log-probabilities are asked, its entries (the first token has
        none). The prompt is read from its start in the choice's running context, which leaves the
        context and the offset where the completion's entries continue."""
        prompt = self.requests[index].prompt
        if self.logprobs is not None and (scores is None or len(scores.logprobs) != len(prompt) - 1):
            raise RuntimeError(f"the engine scored {0 if scores is None else len(scores.logprobs)} of the prompt's "
                               f"{len(prompt) - 1} tokens after the first")
        tops = scores.top_logprobs if self.logprobs is not None else ((),) * (len(prompt) - 1)
        self.context[index], self.offsets[index] = [], 0
        entries = [self._entry(index, prompt[0], ())]
        entries += [self._entry(index, token, alts) for token, alts in zip(prompt[1:], tops, strict=True)]
        texts = [text for text, _, _ in entries]
        if self.logprobs is None:
            return "".join(texts), None
        return "".join(texts), {"tokens": texts, "token_logprobs": [None, *scores.logprobs],
                                "top_logprobs": [None] + [dict(alts) for _, alts, _ in entries[1:]],
                                "text_offset": [offset for *_, offset in entries]}

    def _logprobs(self, index: int, events: list[TokenEvent], echoed: dict | None = None) -> dict | None:
        if self.logprobs is None:
            return None
        entries = [(ev, *self._logprob_entries(index, ev)) for ev in events]
        if self.chat:
            def item(text: str, logprob: float) -> dict:
                return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

            return {"content": [{**item(text, ev.logprob), "top_logprobs": [item(t, lp) for t, lp in alts]}
                                for ev, text, alts, _ in entries]}
        echoed = echoed or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        return {"tokens": echoed["tokens"] + [text for _, text, _, _ in entries],
                "token_logprobs": echoed["token_logprobs"] + [ev.logprob for ev, *_ in entries],
                "top_logprobs": echoed["top_logprobs"] + [dict(alts) for _, _, alts, _ in entries],
                "text_offset": echoed["text_offset"] + [off for *_, off in entries]}

    # ---- whole and streamed ---------------------------------------------------------------
    def _choice(self, index: int, events: list[TokenEvent], reason: str | None, delta: bool,
                scores: PromptScores | None = None) -> dict:
        prompt_text, echoed = self._echoed_prompt(index, scores) if self.echo else ("", None)
        text = prompt_text + "".join(ev.text for ev in events)
        choice: dict[str, Any] = {"index": index, "finish_reason": reason, "logprobs": self._logprobs(index, events, echoed)}
        if self.chat:
            choice["delta" if delta else "message"] = {"content": text} if delta else {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.with_ids:
            choice["token_ids"] = [ev.token_id for ev in events]
        return choice

    def _envelope(self, choices: list[dict], chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.served.model_id, "choices": choices}

    async def whole(self, disconnected: Any = None) -> dict | JSONResponse:
        per_choice: list[list[TokenEvent]] = [[] for _ in self.requests]
        scores: list[PromptScores | None] = [None] * len(self.requests)
        reasons: list[str | None] = ["length"] * len(self.requests)
        try:
            async for index, ev in self.events(disconnected):
                reasons[index] = ev.finish_reason or reasons[index]
                if isinstance(ev, PromptScores):
                    scores[index] = ev
                    continue
                per_choice[index].append(ev)
                self.metrics.add("generated_tokens", 1)
        except ClientGone:
            return error(CLIENT_CLOSED, "the client closed the request", "client_closed")
        except asyncio.CancelledError:
            if not any(req.cancelled.is_set() for req in self.requests):
                self.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - this request's failure, reported as its error
            return error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        self.metrics.observe(time.monotonic() - self.started)
        try:  # token texts of long echoed prompts take a while: off the event loop
            choices = await asyncio.to_thread(
                lambda: [self._choice(i, evs, reasons[i], False, scores[i]) for i, evs in enumerate(per_choice)])
        except RuntimeError as exc:
            return error(500, f"generation failed: {exc}", "server_error")
        body = self._envelope(choices, False)
        return {**body, "usage": self.usage(sum(len(evs) for evs in per_choice))}

    def _chunk(self, choices: list[dict], generated: int) -> str:
        body = self._envelope(choices, True)
        return _sse({**body, "usage": self.usage(generated)} if self.usage_chunks == "every" else body)

    async def stream(self) -> AsyncIterator[str]:
        generated, finished = 0, False
        try:
            if self.chat:
                yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None} for i in range(len(self.requests))], 0)
            async for index, ev in self.events():
                if isinstance(ev, PromptScores):  # echo is refused with stream: never sent
                    continue
                generated += 1
                self.metrics.add("generated_tokens", 1)
                yield self._chunk([self._choice(index, [ev], ev.finish_reason, True)], generated)
            finished = True
            self.metrics.observe(time.monotonic() - self.started)
            if self.usage_chunks != "none":
                yield _sse({**self._envelope([], True), "usage": self.usage(generated)})
            yield "data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001 - the stream has started: an error event, then [DONE]
            finished = True
            body = error_body(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
            yield f"event: error\ndata: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                self.cancel()  # the client went away mid-stream: free its slots


__all__ = ["error", "error_body", "Reply", "CLIENT_CLOSED", "USAGE_CHUNKS"]
