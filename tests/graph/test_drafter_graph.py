"""The drafter graph: its view of its target's store (the ring slots its masks select hold exactly the positions
transformers' assisted generation hands the drafter, across the wrap, whatever was drafted and rejected before) and
its centroid head (transformers' at one row, and a row's logits its own in a batch).

Its drafts and logits against transformers' assisted generation: tests/generation/test_drafting.py."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.graph.drafter import centroid_logits
from neuron_port.graph.masks import drafter_masks, drafter_view, verify_ring
from neuron_port.model.configs import load_config
from neuron_port.model.drafter import build_drafter


@settings(max_examples=150, deadline=None, derandomize=True)
@given(window=st.integers(2, 9), k=st.integers(1, 5), prompt=st.integers(1, 20),
       rounds=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=30))
def test_ring_slots_selected_hold_the_view(window, k, prompt, rounds):
    ring, kv_len = verify_ring(window, k), 256
    held = [-1] * ring  # what each ring slot really holds: the last position written there
    full = [-1] * kv_len

    def write(positions):
        for p in positions:
            held[p % ring], full[p] = p, p

    write(range(prompt))
    pending, written, fed = prompt, prompt - 1, prompt
    for drafted, kept in rounds:
        state = [torch.tensor([x]) for x in (pending, written, fed)]
        last_full, first, last = (int(x) for x in drafter_view(*state, window))
        m_full, m_slide = drafter_masks(*state, kv_len, window, ring)
        seen_slide = sorted(held[s] for s in range(ring) if m_slide[0, 0, 0, s] == 0)
        seen_full = [full[s] for s in range(kv_len) if m_full[0, 0, 0, s] == 0]
        assert seen_full == list(range(last_full + 1))  # every position up to it, each at its own slot
        assert seen_slide == list(range(first, last + 1))  # all there (the ring fits), nothing stale read
        assert last - first <= window and last <= written
        drafted = min(drafted, k)
        write(range(pending, pending + drafted + 1))  # the verify step: the pending token and the drafts
        written, fed = pending + drafted, drafted + 1
        pending += min(kept, drafted) + 1


def test_the_view_is_transformers_rule_on_a_worked_case():
    """Window 4, a 20-token prompt, then a verify of 1 + 3 tokens of which 1 draft kept: pending 22, written 23. Full
    layers read 0..22 (the cache is cut to the 23 tokens ``input_ids`` holds); the sliding cache returned the last
    3 kept + 4 fed positions (17..23), cut to its first 23 (none cut), of which the last 5: 19..23 (the rejected
    drafts' rows included, as transformers reads them)."""
    view = drafter_view(torch.tensor([22]), torch.tensor([23]), torch.tensor([4]), 4)
    assert [int(x) for x in view] == [22, 19, 23]
    after_prefill = drafter_view(torch.tensor([20]), torch.tensor([19]), torch.tensor([20]), 4)
    assert [int(x) for x in after_prefill] == [19, 15, 19]


@torch.no_grad()
def test_the_centroid_head_is_transformers_per_row():
    drafter = build_drafter(load_config("gemma-4-12b", tiny=True), seed=2, ordered=True)
    head, weight = drafter.masked_embedding, drafter.lm_head.weight
    hidden = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
    mine = centroid_logits(head, weight, hidden)
    for row in range(3):
        theirs = head(hidden[row][None, None], weight)[0, 0]  # transformers' own, a batch of one
        assert torch.allclose(mine[row], theirs, atol=1e-5)
    scored = (mine > mine.min(dim=-1, keepdim=True).values).sum(dim=-1)
    per_cluster = weight.shape[0] // head.num_centroids
    assert (scored == head.centroid_intermediate_top_k * per_cluster).all()  # only the best clusters' tokens
    alone = centroid_logits(head, weight, hidden[1:2] * 1)
    assert torch.equal(alone[0], mine[1])  # a row's floor is its own, whatever rows share the batch
