"""One request's decoding state, and one step of it: sample, release text, settle the stop.

The slot batch (:mod:`neuron_port.generation.slots`, the one scheduler) keeps one per occupied slot.
:func:`advance` takes a row's logits for one step and returns its new token, the text it releases
(held back while it may start a stop string), the finish reason if the row is done, and the
log-probabilities when the request asked for them (of the model's distribution: the softcapped
logits, before penalties and temperature, as vLLM reports them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from neuron_port.generation.logits import softcap as apply_softcap
from neuron_port.generation.request import GenerationParams
from neuron_port.generation.sampling import sample_token


@dataclass(frozen=True)
class TokenEvent:
    """One generated token of one row. ``text`` is the newly released text (may be empty). ``drafted`` and
    ``accepted`` (speculative decoding): on the first token a verify step gives a row, the tokens drafted for it in
    that step and how many of them the target emitted; 0 on every other token (so a row's sums are its totals)."""

    row: int
    index: int
    token_id: int
    text: str
    host_ms: float
    graph_ms: float
    finish_reason: str | None = None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class PromptScores:
    """The scores of a prompt whose request asked for them (``GenerationParams.prompt_logprobs``):
    for each prompt token after the first, its log-probability given the tokens before it and the
    most likely (id, log-probability) pairs at that position. Comes once, before the row's first
    token; ``finish_reason`` is ``"length"`` when the request generates nothing after its prompt."""

    row: int
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]
    finish_reason: str | None = None


CONTEXT_TOKENS = 8  # prompt tokens the generated text is decoded after


class TextState:
    """Incremental detokenisation with stop strings (text that may start a stop string is held back).

    The generated tokens are decoded after the last few prompt tokens (``context``), and the text is
    what they add to it: a continuation keeps its leading space where a decoder would drop it."""

    def __init__(self, tokenizer, stops: Sequence[str], context: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.released = 0
        self.text = ""
        self.context = list(context)[-CONTEXT_TOKENS:]
        self.head = tokenizer.decode(self.context) if tokenizer is not None and self.context else ""

    def decode(self, tokens: list[int]) -> str:
        """What ``tokens`` add to the text of the context."""
        if not self.context:
            return self.tokenizer.decode(tokens)
        both = self.tokenizer.decode(self.context + tokens)
        return both[len(self.head):] if both.startswith(self.head) else self.tokenizer.decode(tokens)

    def push(self, tokens: list[int]) -> tuple[str, bool]:
        """Returns (newly released text, stop string hit)."""
        if self.tokenizer is None:
            return "", False
        full = self.decode(tokens)
        for stop in self.stops:
            at = full.find(stop, max(0, self.released - len(stop)))
            if at != -1:
                self.text = full[:at]
                piece = self.text[self.released:]
                self.released = len(self.text)
                return piece, True
        self.text = full
        end = max(self.released, len(full) - self.hold)
        piece = full[self.released:end]
        self.released = end
        return piece, False

    def flush(self) -> str:
        piece = self.text[self.released:]
        self.released = len(self.text)
        return piece


@dataclass
class RowState:
    """One row's decoding state: its parameters, tokens so far, sampler stream, text and stop state.

    ``history``: the prompt and the generated tokens (what a repetition penalty looks at)."""

    params: GenerationParams
    sampler: torch.Generator
    text: TextState
    history: list[int]
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False
    # scoring the prompt: its tokens still to feed, and the scores of those fed
    forced: list[int] = field(default_factory=list)
    prompt_scores: list[tuple[float, tuple[tuple[int, float], ...]]] = field(default_factory=list)
    scores_sent: bool = False

    def finish(self, reason: str) -> None:
        self.done, self.finish_reason = True, reason


def finish_reason(row: RowState, token: int, hit_stop_string: bool, position: int, kv_len: int) -> str | None:
    p = row.params
    if token in p.stop_token_ids or hit_stop_string:
        return "stop"
    if len(row.tokens) >= p.max_new_tokens:
        return "length"
    if position >= kv_len:  # the store is full: nowhere to write the next token's K/V
        return "length"
    return None


@dataclass(frozen=True)
class Step:
    """What one step of one row produced."""

    token: int
    text: str
    finish_reason: str | None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


def logprobs_of(logits: torch.Tensor, token: int, top: int, cap: float | None) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The chosen token's log-probability and the ``top`` most likely (id, log-probability) pairs,
    from raw logits [vocab] (softcapped first)."""
    logp = torch.log_softmax(apply_softcap(logits.double(), cap), dim=-1)
    best = torch.topk(logp, top) if top else None
    pairs = tuple((int(i), float(v)) for v, i in zip(best.values, best.indices, strict=True)) if best is not None else ()
    return float(logp[token]), pairs


def new_row(prompt: Sequence[int], params: GenerationParams, tokenizer=None) -> RowState:
    """The state of a request about to decode (its sampler seeded by ``params.seed``, 0 when None).
    A request that scores its prompt prefills the first token alone and is fed the rest
    (:func:`feed_prompt`), one step each, instead of sampling."""
    row = RowState(params, torch.Generator().manual_seed(params.seed if params.seed is not None else 0),
                   TextState(tokenizer, params.stop_strings, prompt), list(prompt))
    if params.prompt_logprobs is not None:
        row.forced = list(prompt[1:])
    return row


def prefill_length(row: RowState) -> int:
    """How many prompt tokens the row's prefill takes (the whole prompt, or its first token when the
    rest is scored one step at a time)."""
    return len(row.history) - len(row.forced)


def feed_prompt(row: RowState, logits: torch.Tensor, cap: float | None) -> int:
    """Score the row's next prompt token from the logits [vocab] that predict it; the token to feed."""
    token = row.forced.pop(0)
    row.prompt_scores.append(logprobs_of(logits, token, row.params.prompt_logprobs, cap))
    return token


def prompt_scores(row: RowState, index: int) -> PromptScores:
    """The row's prompt scores as an event, sent once (the row is done when it generates nothing after them)."""
    row.scores_sent = True
    reason = "length" if row.params.max_new_tokens == 0 else None
    if reason is not None:
        row.finish(reason)
    return PromptScores(index, tuple(lp for lp, _ in row.prompt_scores), tuple(top for _, top in row.prompt_scores), reason)


def advance(row: RowState, logits: torch.Tensor, position: int, kv_len: int, cap: float | None) -> Step:
    """One step of one row from its logits [vocab]: the token, released text, finish reason, logprobs."""
    p = row.params
    recent = row.history if p.sampling.repetition_penalty != 1.0 else ()
    tok = sample_token(logits, p.sampling, cap, row.sampler, recent, row.tokens if p.sampling.additive else ())
    logprob, top = logprobs_of(logits, tok, p.logprobs, cap) if p.logprobs is not None else (None, ())
    row.tokens.append(tok)
    row.history.append(tok)
    piece, hit_stop_string = row.text.push(row.tokens)
    reason = finish_reason(row, tok, hit_stop_string, position, kv_len)
    if reason is not None:
        piece += row.text.flush() if not hit_stop_string else ""
        row.finish(reason)
    return Step(tok, piece, reason, logprob, top)


__all__ = ["TokenEvent", "PromptScores", "TextState", "RowState", "Step", "finish_reason",
           "logprobs_of", "new_row", "prefill_length", "feed_prompt", "prompt_scores", "advance"]
