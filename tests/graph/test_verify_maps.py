"""A verify step's masks and writes (speculative decoding): across many steps of drafts, acceptances and rejections,
and across the ring's wrap, every query sees exactly the positions of its window, each holding what the accepted
sequence wrote there: never a rejected draft's row, never a row the step overwrote."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.graph.masks import decode_masks, prefill_writes, verify_maps, verify_ring

NEG = torch.finfo(torch.float32).min


def _write(buf: list, onehot: torch.Tensor, contents: list) -> None:
    """Apply a ``[S, slots]`` one-hot write map of one row to a list of slot contents."""
    for step, row in enumerate(onehot):
        for slot in row.nonzero().flatten().tolist():
            buf[slot] = contents[step]


def _run(window: int, k: int, prompt: int, rounds: list[tuple[int, int]], kv_len: int, use_ring: bool,
         ring: int | None = None) -> None:
    """Simulate one row: a prompt, then verify steps of ``d`` drafted tokens of which ``a`` are accepted. Each slot
    holds ``(position, writer)``; ``accepted[pos]`` is the writer whose row at ``pos`` is the sequence's."""
    ring = (ring or verify_ring(window, k)) if use_ring else None
    positions = torch.arange(prompt)[None, :]
    _, sliding_w = prefill_writes(positions, torch.tensor([prompt]), kv_len, ring)
    full_w = prefill_writes(positions, torch.tensor([prompt]), kv_len, None)[0]
    full, sliding = [None] * kv_len, [None] * (ring or kv_len)
    _write(full, full_w[0], [(p, "prompt") for p in range(prompt)])
    _write(sliding, sliding_w[0], [(p, "prompt") for p in range(prompt)])
    accepted = {p: "prompt" for p in range(prompt)}
    length = prompt  # positions 0..length-1 are the sequence's; the step feeds the next token at ``length``
    for step, (d, a) in enumerate(rounds):
        d = min(d, k)
        a = min(a, d)
        chunk = torch.arange(length, length + d + 1)[None, :]
        if int(chunk[0, -1]) >= kv_len:
            return
        m_full, m_slide, w_full, w_slide = verify_maps(chunk, kv_len, window, ring)
        writer = f"step{step}"
        _write(full, w_full[0], [(p, writer) for p in chunk[0].tolist()])
        _write(sliding, w_slide[0], [(p, writer) for p in chunk[0].tolist()])
        for i, q in enumerate(chunk[0].tolist()):
            want = {p: accepted.get(p, writer) if p < length else writer for p in range(q + 1)}
            seen_full = {full[s] for s in range(kv_len) if m_full[0, 0, i, s] == 0}
            assert seen_full == set(want.items()), (step, q)
            seen_slide = {sliding[s] for s in range(len(sliding)) if m_slide[0, 0, i, s] == 0}
            assert seen_slide == {(p, w) for p, w in want.items() if q - p < window}, (step, q, ring)
        for p in range(length, length + a + 1):  # the fed token and the kept drafts
            accepted[p] = writer
        length += a + 1


@settings(max_examples=150, deadline=None, derandomize=True)
@given(window=st.integers(2, 6), k=st.integers(1, 5), prompt=st.integers(1, 9), use_ring=st.booleans(),
       rounds=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=12))
def test_every_query_sees_its_window_of_accepted_rows(window, k, prompt, use_ring, rounds):
    _run(window, k, prompt, rounds, kv_len=64, use_ring=use_ring)


def test_a_ring_of_the_window_alone_would_read_a_rejected_or_overwritten_row(monkeypatch):
    """The planted failure: rings of ``window`` slots (what plain decode uses) lose rows a verify step needs."""
    window, k = 4, 3
    with pytest.raises(ValueError, match="at least window \\+ 3 = 7 slots, found 4"):
        verify_maps(torch.arange(5, 9)[None, :], 64, window, window)
    import neuron_port.graph.masks as masks

    monkeypatch.setattr(masks, "check_verify_ring", lambda *a: None)  # past the guard: the visibility check fails
    with pytest.raises(AssertionError):
        _run(window, k, 6, [(3, 0), (3, 3), (3, 1)], 64, use_ring=True, ring=window)
    _run(window, k, 6, [(3, 0), (3, 3), (3, 1)], 64, use_ring=True)  # the same rounds on the ring it needs


def test_one_token_verify_is_a_decode_step():
    """With no draft, the verify step's masks are decode's."""
    for ring in (None, 5):
        positions = torch.tensor([3, 7, 11])
        m_full, m_slide, _, _ = verify_maps(positions[:, None], 16, 5, ring)
        d_full, d_slide = decode_masks(positions, 16, 5, ring)
        assert torch.equal(m_full, d_full) and torch.equal(m_slide, d_slide)
