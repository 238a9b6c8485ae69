"""Host sampling: the fast full-vocab path equals a straightforward reference, ties and boundaries included."""


import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from neuron_port.generation.sampling import (
    SamplingParams,
    _tie_inclusive_topk,
    draw,
    fast_argmax,
    filtered_distribution,
    reference_distribution,
    sample_token,
)

# Small integer-valued logits make ties common; scale spreads them.
logit_lists = st.lists(st.integers(-6, 6), min_size=2, max_size=40)


@st.composite
def cases(draw_):
    values = draw_(logit_lists)
    scale = draw_(st.sampled_from([0.5, 1.0, 7.0, 40.0]))
    raw = torch.tensor(values, dtype=torch.float32) * scale
    params = SamplingParams(
        temperature=draw_(st.sampled_from([0.3, 0.7, 1.0, 1.5])),
        top_k=draw_(st.integers(0, len(values) + 2)),
        top_p=draw_(st.sampled_from([1.0, 0.9, 0.5, 0.25, 0.1])),
        repetition_penalty=draw_(st.sampled_from([1.0, 1.3, 0.8])),
    )
    previous = draw_(st.lists(st.integers(0, len(values) - 1), max_size=5))
    cap = draw_(st.sampled_from([None, 30.0, 5.0]))
    return raw, params, previous, cap


@given(cases())
def test_fast_distribution_equals_reference(case):
    raw, params, previous, cap = case
    ids, probs = filtered_distribution(raw, params, cap, previous)
    dense = torch.zeros(raw.shape[0], dtype=torch.float64)
    dense[ids] = probs
    expected = reference_distribution(raw, params, cap, previous)
    torch.testing.assert_close(dense, expected, rtol=1e-12, atol=1e-12)
    assert torch.all(ids[1:] > ids[:-1])  # ascending ids, no duplicates


@given(st.integers(2, 30), st.integers(0, 10_000))
def test_top_p_exactly_on_a_boundary(n, seed):
    """top_p equal to a cumulative mass: the boundary token is kept, the next is not."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(n, generator=g, dtype=torch.float64)
    probs = torch.softmax(raw, 0)
    ordered = torch.sort(probs, descending=True).values
    k = int(torch.randint(1, n, (1,), generator=g))
    top_p = float(torch.cumsum(ordered, 0)[k - 1])
    assume(0.0 < top_p <= 1.0)
    params = SamplingParams(temperature=1.0, top_p=min(top_p, 1.0))
    ids, _ = filtered_distribution(raw, params, None)
    dense = reference_distribution(raw, params, None)
    assert set(ids.tolist()) == set(torch.nonzero(dense).flatten().tolist())


def test_ties_at_top_k_boundary_are_all_kept():
    raw = torch.tensor([3.0, 1.0, 3.0, 2.0, 2.0, 0.0])
    ids, probs = filtered_distribution(raw, SamplingParams(temperature=1.0, top_k=3), 30.0)
    assert ids.tolist() == [0, 2, 3, 4]


@given(cases(), st.integers(0, 2**31 - 1))
def test_seeded_draws_repeat_and_follow_the_distribution(case, seed):
    raw, params, previous, cap = case
    ids, probs = filtered_distribution(raw, params, cap, previous)
    a = draw(ids, probs, torch.Generator().manual_seed(seed))
    b = draw(ids, probs, torch.Generator().manual_seed(seed))
    assert a == b and probs[ids.tolist().index(a)] > 0


def test_draw_frequencies_match_probabilities():
    raw = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])
    params = SamplingParams(temperature=0.8, top_k=4)
    ids, probs = filtered_distribution(raw, params, 30.0)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(4000):
        counts[draw(ids, probs, g)] += 1
    dense = torch.zeros(5, dtype=torch.float64)
    dense[ids] = probs
    assert torch.allclose(counts / 4000, dense.float(), atol=0.03)
    assert counts[3] == 0  # outside the top 4


def test_greedy_is_argmax_of_raw_logits():
    raw = torch.tensor([0.1, 5.0, 4.9, -2.0])
    assert sample_token(raw, SamplingParams(), 30.0, None) == 1
    # a repetition penalty can move the greedy choice
    assert sample_token(raw, SamplingParams(repetition_penalty=2.0), 30.0, None, previous=[1]) == 2


def test_bad_params_are_rejected():
    for kwargs in ({"temperature": -1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}, {"repetition_penalty": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)


# ---- blocked searches over large vocabularies (the paths a 262,144-entry vocabulary takes) ----
@st.composite
def big_logits(draw_):
    vocab = draw_(st.integers(1025, 12000))  # includes sizes that are not multiples of the block
    seed = draw_(st.integers(0, 2**16))
    spread = draw_(st.sampled_from([3, 50, 10**6]))  # 3: ties everywhere, including at the top
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-spread, spread + 1, (vocab,), generator=gen).to(torch.float32)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(big_logits())
def test_fast_argmax_is_the_first_argmax(raw):
    assert fast_argmax(raw) == int(torch.argmax(raw))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(big_logits(), st.integers(1, 4))
def test_blocked_topk_keeps_exactly_the_ties_inclusive_top_k(raw, k):
    kth = torch.sort(raw, descending=True).values[k - 1]
    expected = torch.nonzero(raw >= kth).flatten()
    assert torch.equal(_tie_inclusive_topk(raw, k), expected)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(big_logits(), st.sampled_from([0.9, 0.5, 1.0]))
def test_fast_distribution_equals_reference_on_a_large_vocabulary(raw, top_p):
    # logits within +-60: the softcap (30) bends them but does not saturate tanh into new ties
    raw = raw / raw.abs().max() * 60
    params = SamplingParams(temperature=0.8, top_k=3, top_p=top_p)
    ids, probs = filtered_distribution(raw, params, 30.0)
    dense = torch.zeros(raw.shape[0], dtype=torch.float64)
    dense[ids] = probs
    assert torch.allclose(dense, reference_distribution(raw, params, 30.0), atol=1e-12)
