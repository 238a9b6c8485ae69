"""Speculative decoding on the host: drafting by prompt lookup, and accepting a draft against the target's verify step.

A verify step runs the target over ``k + 1`` positions (the last accepted token, then the ``k`` drafted ones) and
returns ``k + 1`` rows of logits: row ``i`` is the target's distribution for the token after the first ``i`` drafted
tokens. What it accepts:

* greedy (:func:`greedy_accept`): the longest prefix of the draft equal to the target's argmax at each row, then the
  target's own argmax after it, so the output is token for token what greedy decoding without a draft gives;
* sampling (:func:`rejection_accept`): the standard rule of speculative sampling (Leviathan et al. 2023; Chen et al.
  2023): drafted token ``x`` at row ``i`` is kept with probability ``min(1, p_i(x) / q_i(x))``; at the first
  rejection a token is drawn from ``max(0, p_i - q_i)`` renormalised, and when every drafted token is kept one more
  is drawn from ``p_k``. Each emitted token is then distributed as the target's ``p``, whatever ``q`` is.

Prompt lookup (:func:`ngram_draft`) drafts with no model: the continuation of an earlier occurrence of the text's
last n-gram, found as transformers' ``PromptLookupCandidateGenerator`` finds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def ngram_draft(tokens: Sequence[int], k: int, max_ngram: int = 2, stop_ids: Sequence[int] = (),
                max_length: int | None = None) -> list[int]:
    """Up to ``k`` drafted tokens for ``tokens`` (prompt and output so far) by prompt lookup.

    For n-gram sizes from ``max_ngram`` down to 1 (never the whole text), the first earlier occurrence, left to
    right, of the text's last ``n`` tokens that has a continuation gives up to ``k`` tokens after it (not past the
    text's end, nor past ``max_length`` tokens in all), cut before the first of ``stop_ids``; [] when nothing
    matches. The same rule, and the same default n-gram size, as transformers' ``PromptLookupCandidateGenerator``."""
    if k < 1 or max_ngram < 1:
        raise ValueError(f"prompt lookup drafts k >= 1 tokens from n-grams of size >= 1, found k={k}, "
                         f"max_ngram={max_ngram}")
    text = list(tokens)
    length = len(text)
    end_limit = length if max_length is None else min(length, max_length)
    for n in range(min(max_ngram, length - 1), 0, -1):
        suffix = text[-n:]
        for start in range(length - n + 1):
            if text[start:start + n] != suffix:
                continue
            begin, end = start + n, min(start + n + k, end_limit)
            if begin >= end:
                continue
            draft = text[begin:end]
            stops = [i for i, token in enumerate(draft) if token in stop_ids]
            return draft[: stops[0]] if stops else draft
    return []


@dataclass(frozen=True)
class Accepted:
    """What one verify step gives a row: ``drafted`` tokens were proposed, the first ``accepted`` of them kept, and
    ``tokens`` are emitted (the kept ones, then the target's own token: ``accepted + 1`` in all)."""

    drafted: int
    accepted: int
    tokens: list[int]


def greedy_accept(draft: Sequence[int], target_argmax: Sequence[int]) -> Accepted:
    """Greedy acceptance: ``target_argmax`` ``[len(draft) + 1]`` is the target's argmax at each verified row. Keeps
    the longest prefix of ``draft`` that equals it, then emits the target's argmax after that prefix."""
    if len(target_argmax) != len(draft) + 1:
        raise ValueError(f"a verify step over {len(draft)} drafted tokens gives {len(draft) + 1} rows, found "
                         f"{len(target_argmax)}")
    kept = 0
    while kept < len(draft) and draft[kept] == target_argmax[kept]:
        kept += 1
    return Accepted(len(draft), kept, [*draft[:kept], int(target_argmax[kept])])


def rejection_accept(draft: Sequence[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     generator: torch.Generator | None = None) -> Accepted:
    """Speculative sampling's acceptance: ``draft_probs`` ``[k, vocab]`` the distributions the draft was sampled
    from (a one-hot row for a deterministic drafter such as prompt lookup), ``target_probs`` ``[k + 1, vocab]``
    the target's (after temperature and top-k/top-p, as plain sampling would use them). The emitted tokens are
    distributed exactly as sampling the target alone."""
    k = len(draft)
    if tuple(draft_probs.shape[:1]) != (k,) or target_probs.shape[0] != k + 1:
        raise ValueError(f"{k} drafted tokens need draft_probs [{k}, vocab] and target_probs [{k + 1}, vocab], "
                         f"found {tuple(draft_probs.shape)} and {tuple(target_probs.shape)}")
    p, q = target_probs.double(), draft_probs.double()
    for i, token in enumerate(draft):
        keep = torch.clamp(p[i, token] / q[i, token], max=1.0) if q[i, token] > 0 else torch.tensor(0.0)
        if torch.rand((), generator=generator, dtype=torch.float64) < keep:
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        total = residual.sum()
        # p == q leaves no residual; a rejection there has probability 0, but rounding may still land here
        choice = p[i] if total <= 0 else residual / total
        return Accepted(k, i, [*draft[:i], int(torch.multinomial(choice, 1, generator=generator))])
    return Accepted(k, k, [*draft, int(torch.multinomial(p[k], 1, generator=generator))])


__all__ = ["ngram_draft", "Accepted", "greedy_accept", "rejection_accept"]
