"""Speculative decoding's host side: prompt lookup drafts as transformers' own drafts, greedy acceptance keeps greedy
output token for token, and the rejection rule keeps the target's distribution (a wrong rule fails the same test)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.generation.speculative import Accepted, greedy_accept, ngram_draft, rejection_accept

TOKENS = st.lists(st.integers(0, 5), min_size=1, max_size=40)  # a small alphabet: n-grams repeat


@settings(max_examples=200, deadline=None, derandomize=True)
@given(tokens=TOKENS, k=st.integers(1, 8), max_ngram=st.integers(1, 4), stop=st.sampled_from([(), (3,), (0, 5)]))
def test_prompt_lookup_drafts_what_transformers_drafts(tokens, k, max_ngram, stop):
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    theirs = PromptLookupCandidateGenerator(eos_token_id=torch.tensor(stop, dtype=torch.long) if stop else None,
                                            num_output_tokens=k, max_matching_ngram_size=max_ngram, max_length=10_000)
    ids = torch.tensor([tokens])
    candidates, _ = theirs.get_candidates(ids)
    assert ngram_draft(tokens, k, max_ngram, stop) == candidates[0, len(tokens):].tolist()


def _target(prefix: list[int], vocab: int = 7) -> int:
    """A deterministic stand-in for a target model's argmax: repeats with period 5 with a twist, so lookups hit
    and miss."""
    return (sum(prefix[-3:]) * 3 + len(prefix) // 5) % vocab


def _speculative_greedy(prompt: list[int], new: int, k: int, off_by: int = 0) -> tuple[list[int], int, int]:
    """Greedy generation by draft and verify, the verify's rows from :func:`_target`; ``off_by`` plants an error in
    the accepted length."""
    text, drafted, accepted = list(prompt), 0, 0
    while len(text) - len(prompt) < new:
        draft = ngram_draft(text, k)
        rows = [_target(text + draft[:i]) for i in range(len(draft) + 1)]
        step = greedy_accept(draft, rows)
        kept = min(len(draft), step.accepted + off_by)
        emitted = [*draft[:kept], rows[kept]] if off_by else step.tokens
        drafted, accepted = drafted + step.drafted, accepted + step.accepted
        text += emitted
    return text[len(prompt): len(prompt) + new], drafted, accepted


@settings(max_examples=120, deadline=None, derandomize=True)
@given(prompt=st.lists(st.integers(0, 6), min_size=1, max_size=24), new=st.integers(1, 40), k=st.integers(1, 8))
def test_greedy_speculation_gives_greedy_output(prompt, new, k):
    plain = list(prompt)
    for _ in range(new):
        plain.append(_target(plain))
    got, drafted, accepted = _speculative_greedy(prompt, new, k)
    assert got == plain[len(prompt):] and 0 <= accepted <= drafted


def test_an_off_by_one_in_the_accepted_length_is_caught():
    prompts = [[i % 7, (3 * i) % 7, 1, 2, 1, 2, 1] for i in range(12)]
    wrong = 0
    for prompt in prompts:
        plain = list(prompt)
        for _ in range(30):
            plain.append(_target(plain))
        wrong += _speculative_greedy(prompt, 30, 4, off_by=1)[0] != plain[len(prompt):]
    assert wrong > 0


@settings(max_examples=100, deadline=None, derandomize=True)
@given(argmax=st.lists(st.integers(0, 9), min_size=1, max_size=9), cut=st.integers(0, 8), bad=st.integers(1, 9))
def test_greedy_keeps_the_longest_agreeing_prefix(argmax, cut, bad):
    k = len(argmax) - 1
    cut = min(cut, k)
    draft = argmax[:cut] + ([(argmax[cut] + bad) % 10] if cut < k else []) + argmax[cut + 1: k]
    step = greedy_accept(draft, argmax)
    assert step == Accepted(k, cut, argmax[: cut + 1])


def test_a_verify_step_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="2 drafted tokens gives 3 rows, found 2"):
        greedy_accept([1, 2], [1, 2])


VOCAB, K, DRAWS = 5, 2, 30_000


def _chi2_critical(df: int, tail: float) -> float:
    """The chi-square value exceeded with probability ``tail`` at an even ``df``: its survival function is
    ``exp(-x/2) * sum_{i < df/2} (x/2)^i / i!``, solved by bisection (no scipy in every test environment)."""
    import math

    def survival(x: float) -> float:
        return math.exp(-x / 2) * sum((x / 2) ** i / math.factorial(i) for i in range(df // 2))

    low, high = 0.0, 1000.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if survival(mid) > tail else (low, mid)
    return high


def _distributions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(K + 1, VOCAB, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(K, VOCAB, generator=gen, dtype=torch.float64), -1)
    return p, q


def _always_accept(draft, q, p, generator):
    return Accepted(len(draft), len(draft), [*draft, int(torch.multinomial(p[-1], 1, generator=generator))])


def _resample_from_target(draft, q, p, generator):
    """A wrong rule: on rejection, draw from the target itself instead of the residual."""
    for i, token in enumerate(draft):
        if torch.rand((), generator=generator, dtype=torch.float64) < min(1.0, float(p[i, token] / q[i, token])):
            continue
        return Accepted(len(draft), i, [*draft[:i], int(torch.multinomial(p[i], 1, generator=generator))])
    return Accepted(len(draft), len(draft), [*draft, int(torch.multinomial(p[-1], 1, generator=generator))])


def _first_token_statistic(rule, seed: int) -> float:
    """Chi-square statistic of the first emitted token's counts against the target's first distribution."""
    p, q = _distributions(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for _ in range(DRAWS):
        draft = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(K)]
        counts[rule(draft, q, p, gen).tokens[0]] += 1
    expected = DRAWS * p[0]
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("seed", [0, 1])
def test_the_rejection_rule_keeps_the_targets_distribution_and_wrong_rules_do_not(seed):
    bound = _chi2_critical(VOCAB - 1, 1e-6)  # a right rule exceeds it once in a million runs
    assert _first_token_statistic(rejection_accept, seed) < bound
    assert _first_token_statistic(_always_accept, seed) > bound
    assert _first_token_statistic(_resample_from_target, seed) > bound


def test_the_critical_value_is_the_chi_square_tables():
    assert abs(_chi2_critical(4, 0.05) - 9.4877) < 1e-3 and abs(_chi2_critical(2, 0.01) - 9.2103) < 1e-3


def test_a_one_hot_draft_is_kept_with_the_targets_probability():
    """Prompt lookup's draft is deterministic (q one-hot): its token is kept with probability p(x)."""
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    kept = sum(rejection_accept([0], q, p, gen).accepted for _ in range(4000))
    assert abs(kept / 4000 - 0.7) < 0.03
