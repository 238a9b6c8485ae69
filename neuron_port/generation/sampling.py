"""Sampling at full vocabulary on the host, exactly as from the softcapped distribution.

Semantics (Hugging Face's processor order): OpenAI's additive adjustments first (``logit_bias``,
and presence / frequency penalties over the tokens generated so far, as vLLM applies them) on the
softcapped logits, then the repetition penalty, then temperature, then top-k (every token tied
with the k-th value kept), then top-p (the smallest set of most likely tokens whose probability
reaches ``top_p``, plus every token tied with the last one kept), then a draw.

:func:`filtered_distribution` computes this without a full sort over the vocabulary and with
the softcap applied only where it is needed: with top-k, the candidates are the raw top
``k + |penalised|`` tokens (softcap is increasing, so raw order is capped order; penalised
tokens can only move within that set) plus the penalised tokens; without top-k the softmax
needs every token, and top-p grows a ``topk`` until the nucleus is inside it. The top-k and
greedy searches over the vocabulary go block by block (:func:`fast_argmax`), because CPU
``argmax``/``topk`` over 262,144 entries cost more than the rest of a decode step's host work.
One edge: raw logits beyond about +-570 saturate ``tanh`` in float64, so distinct raw values can
become equal capped values; the fast path then keeps the raw order, the reference the ties.
:func:`reference_distribution` is the straightforward version (softcap everything, sort
everything) that the property tests compare against. The math runs in float64.

A draw is an inverse-CDF over the candidates in token-id order with one uniform number from
a seeded ``torch.Generator``, so equal distributions and equal seeds give equal tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from neuron_port.generation.logits import softcap


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters.

    ``presence_penalty`` / ``frequency_penalty`` (OpenAI's, in [-2, 2]) subtract once per generated
    token present / once per occurrence; ``logit_bias`` adds (token id, bias) pairs."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], found {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, found {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, found {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], found {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, found {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def additive(self) -> bool:
        """Whether logit_bias or presence / frequency penalties change the logits."""
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def adjust_logits(
    raw: torch.Tensor, params: SamplingParams, cap: float | None, generated: Sequence[int] = ()
) -> tuple[torch.Tensor, float | None]:
    """The additive adjustments on the softcapped logits: (values [vocab] float64, the cap still
    to apply). Without any, ``raw`` and ``cap`` come back untouched (the fast paths stay fast)."""
    if not params.additive:
        return raw, cap
    values = softcap(raw.double(), cap).clone()
    if generated and (params.presence_penalty or params.frequency_penalty):
        ids, counts = torch.unique(torch.as_tensor(list(generated)), return_counts=True)
        values[ids] -= params.frequency_penalty * counts.double() + params.presence_penalty
    if params.logit_bias:
        ids = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.long)
        values.index_add_(0, ids, torch.tensor([bias for _, bias in params.logit_bias], dtype=values.dtype))
    return values, None


def _penalise(values: torch.Tensor, ids: torch.Tensor, penalised: torch.Tensor, penalty: float) -> torch.Tensor:
    if penalty == 1.0 or penalised.numel() == 0:
        return values
    hit = torch.isin(ids, penalised)
    changed = torch.where(values < 0, values * penalty, values / penalty)
    return torch.where(hit, changed, values)


def _top_p_keep(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask of the nucleus over a small candidate vector (tie-inclusive at the boundary)."""
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    ordered = torch.sort(probs, descending=True).values
    cum = torch.cumsum(ordered, 0)
    cut = int(torch.searchsorted(cum, torch.tensor(top_p, dtype=cum.dtype)).clamp(max=len(ordered) - 1))
    return probs >= ordered[cut]


def reference_distribution(
    raw: torch.Tensor,
    params: SamplingParams,
    cap: float | None,
    previous: Sequence[int] = (),
    generated: Sequence[int] = (),
) -> torch.Tensor:
    """Straightforward dense version, written independently of the fast path.

    raw [vocab] -> probabilities [vocab] (float64): softcap everything, penalise token by token,
    sort everything, walk the sorted list for the nucleus.
    """
    x = softcap(raw.double(), cap).clone()
    return _reference_after_cap(x, params, previous, generated)


def _reference_after_cap(
    x: torch.Tensor, params: SamplingParams, previous: Sequence[int], generated: Sequence[int]
) -> torch.Tensor:
    for token in generated:  # one token at a time: frequency per occurrence
        x[token] -= params.frequency_penalty
    for token in set(generated):
        x[token] -= params.presence_penalty
    for token, bias in params.logit_bias:
        x[token] += bias
    for token in sorted(set(previous)):
        v = x[token]
        x[token] = v * params.repetition_penalty if v < 0 else v / params.repetition_penalty
    x = x / params.temperature
    if params.top_k:
        kth = torch.sort(x, descending=True).values[min(params.top_k, x.shape[0]) - 1]
        x[x < kth] = float("-inf")
    probs = torch.softmax(x, 0)
    if params.top_p < 1.0:
        ordered = torch.sort(probs, descending=True).values.tolist()
        total, last = 0.0, ordered[-1]
        for p in ordered:
            total += p
            if total >= params.top_p:
                last = p
                break
        probs[probs < last] = 0.0
        probs = probs / probs.sum()
    return probs


BLOCK = 256  # vocabulary entries per block in the blocked maximum searches


def _blocks(values: torch.Tensor) -> torch.Tensor:
    """[vocab] -> [ceil(vocab / BLOCK), BLOCK], padded with -inf (a view when vocab divides)."""
    pad = -values.shape[0] % BLOCK
    if pad:
        values = torch.cat([values, values.new_full((pad,), float("-inf"))])
    return values.view(-1, BLOCK)


def fast_argmax(values: torch.Tensor) -> int:
    """``int(torch.argmax(values))`` for a 1-D float tensor without NaNs (first index on ties).

    CPU ``argmax`` over a 262,144-entry vocabulary runs scalar; the maximum of each block is a
    vectorised reduction, so the search is: the first block holding the maximum, then the first
    position in it.
    """
    if values.shape[0] <= 4 * BLOCK:
        return int(torch.argmax(values))
    blocks = _blocks(values)
    row = int(torch.argmax(blocks.amax(dim=1)))
    return row * BLOCK + int(torch.argmax(blocks[row]))


def _tie_inclusive_topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending indices of every entry >= the k-th largest value (no full sort).

    Blocked: the k-th largest block maximum ``t`` is a lower bound of the k-th largest value
    (k distinct entries reach ``t``), so every wanted entry lies in a block whose maximum is
    >= ``t``; only those blocks (about k of them) are searched.
    """
    k = min(k, values.shape[0])
    if values.shape[0] <= 4 * BLOCK * max(k, 1):
        kth = torch.topk(values, k).values[-1]
        return torch.nonzero(values >= kth).flatten()
    blocks = _blocks(values)
    maxima = blocks.amax(dim=1)
    bound = torch.topk(maxima, k).values[-1]
    rows = torch.nonzero(maxima >= bound).flatten()
    candidates = blocks[rows]
    kth = torch.topk(candidates.flatten(), k).values[-1]
    hit = torch.nonzero(candidates >= kth)
    return torch.sort(rows[hit[:, 0]] * BLOCK + hit[:, 1]).values


def filtered_distribution(
    raw: torch.Tensor, params: SamplingParams, cap: float | None, previous: Sequence[int] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast version: raw [vocab] -> (candidate ids [n] ascending, probabilities [n] float64)."""
    penalised = torch.tensor(sorted(set(previous)), dtype=torch.long)
    if params.top_k:
        pool = _tie_inclusive_topk(raw, params.top_k + penalised.numel())
        pool = torch.unique(torch.cat([pool, penalised]))
    else:
        pool = torch.arange(raw.shape[0])
    x = softcap(raw[pool].double(), cap)
    x = _penalise(x, pool, penalised, params.repetition_penalty) / params.temperature
    if params.top_k:
        keep = x >= torch.topk(x, min(params.top_k, x.shape[0])).values[-1]
        pool, x = pool[keep], x[keep]
    probs = torch.softmax(x, 0)
    if params.top_p < 1.0:
        if params.top_k:
            keep = _top_p_keep(probs, params.top_p)
        else:
            keep = _nucleus_without_sort(probs, params.top_p)
        pool, probs = pool[keep], probs[keep]
        probs = probs / probs.sum()
    return pool, probs


def _nucleus_without_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus mask over the full vocabulary, growing a topk instead of sorting everything."""
    m = min(256, probs.shape[0])
    while True:
        top = torch.topk(probs, m).values
        cum = torch.cumsum(top, 0)
        if cum[-1] >= top_p or m == probs.shape[0]:
            cut = int(torch.searchsorted(cum, torch.tensor(top_p, dtype=cum.dtype)).clamp(max=m - 1))
            return probs >= top[cut]
        m = min(probs.shape[0], 4 * m)


def draw(ids: torch.Tensor, probs: torch.Tensor, generator: torch.Generator) -> int:
    """Inverse-CDF draw over candidates in ascending id order with one uniform number."""
    u = torch.rand((), generator=generator, dtype=torch.float64)
    cum = torch.cumsum(probs, 0)
    index = int(torch.searchsorted(cum, u * cum[-1], right=True).clamp(max=len(ids) - 1))
    return int(ids[index])


def sample_token(
    raw: torch.Tensor,
    params: SamplingParams,
    cap: float | None,
    generator: torch.Generator | None,
    previous: Sequence[int] = (),
    generated: Sequence[int] = (),
) -> int:
    """One token from raw logits [vocab]: argmax when greedy (softcap-invariant), else a draw.

    ``previous``: the prompt and the tokens so far (repetition penalty); ``generated``: the tokens
    generated so far (presence and frequency penalties)."""
    raw, cap = adjust_logits(raw, params, cap, generated)
    if params.greedy:
        if params.repetition_penalty != 1.0 and previous:
            ids, probs = filtered_distribution(raw, SamplingParams(1.0, 1, 1.0, params.repetition_penalty), cap, previous)
            return int(ids[torch.argmax(probs)])
        return fast_argmax(raw)
    ids, probs = filtered_distribution(raw, params, cap, previous)
    return draw(ids, probs, generator)


__all__ = [
    "SamplingParams",
    "adjust_logits",
    "reference_distribution",
    "filtered_distribution",
    "draw",
    "fast_argmax",
    "sample_token",
]
