"""Static masks and one-hot write maps for prefill and decode, built inside the graphs.

The graphs take their position ids and each row's length (:class:`~neuron_port.graph.step.StepInputs`)
and build their masks, decode's write maps and the last-token pick from them with :func:`step_maps`,
on the device the inputs are on: a prefill of ``T`` tokens at KV length ``kv_len`` would otherwise ship ``[batch, T, kv_len]``
maps from the host on every call. Every builder here is trace-safe (static sizes, no Python branch
on a tensor's value) and makes its tensors where its index tensor lives.

Conventions (all consistent with :mod:`neuron_port.graph.kv`):

* A full-attention buffer slot ``s`` holds position ``s``.
* A sliding ring of ``window`` slots holds position ``p`` in slot ``p % window``.
* Hugging Face's sliding attention lets query ``q`` see key ``k`` when ``0 <= q - k < window``.
  ``window=None`` (a model without sliding layers) makes the sliding masks equal the full ones.
* Additive masks: 0 where attention is allowed, the dtype's minimum where it is not.

Prompts are right-padded to the bucket length; ``lengths[b]`` is row b's real length. A prefill's
maps are built from its position ids, inputs of the graph: a traced graph cannot fold them into
constants of ``bucket x kv_len`` elements.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device))


def ring_positions(last: torch.Tensor, window: int) -> torch.Tensor:
    """Absolute position held by each ring slot once positions ``0..last`` are written.

    last: [batch] (long) -> [batch, window]; -1 where a slot was never written.
    """
    slots = torch.arange(window, device=last.device)[None, :]
    held = last[:, None] - torch.remainder(last[:, None] - slots, window)
    return torch.where(held >= 0, held, torch.full_like(held, -1))


def prefill_masks(
    positions: torch.Tensor, window: int | None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal masks over the padded prompt for full and sliding layers.

    positions: [batch, bucket] (each row ``0..bucket-1``) -> (full [batch, 1, bucket, bucket],
    sliding [batch, 1, bucket, bucket]). Padded query rows still see themselves, so no row is fully
    masked. Built from the positions (a graph input), so a traced graph cannot fold them into a
    constant of the bucket's square.
    """
    q = positions[:, :, None]
    k = positions[:, None, :]
    causal = k <= q
    sliding = causal & (q - k < window) if window is not None else causal
    return _additive(causal, dtype)[:, None], _additive(sliding, dtype)[:, None]


def prefill_writes(
    positions: torch.Tensor, lengths: torch.Tensor, kv_len: int, ring: int | None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot write maps that store a prefilled prompt's K/V.

    Full buffers: step p -> slot p for every real position. Rings: step p -> slot p % ring
    only for the last ``ring`` real positions (older ones would be overwritten anyway).
    ``ring=None`` gives sliding owners a full-length buffer (same map as full layers).

    positions: [batch, bucket], lengths: [batch] -> (full [batch, bucket, kv_len], sliding [batch,
    bucket, ring or kv_len]).
    """
    real = positions < lengths[:, None]  # [batch, bucket]
    full = (positions[..., None] == torch.arange(kv_len, device=positions.device)[None, None, :]) & real[..., None]
    if ring is None:
        return full.to(dtype), full.to(dtype)
    recent = real & (positions >= (lengths[:, None] - ring))
    slots = torch.remainder(positions, ring)
    sliding = (slots[..., None] == torch.arange(ring, device=positions.device)[None, None, :]) & recent[..., None]
    return full.to(dtype), sliding.to(dtype)


def _slot_row(positions: torch.Tensor, kv_len: int, slot_ids: torch.Tensor | None) -> torch.Tensor:
    """[1, kv_len]: the position each full-attention slot holds, from ``slot_ids`` (a graph input) or built here."""
    if slot_ids is None:
        return torch.arange(kv_len, device=positions.device)[None, :]
    if slot_ids.shape != (kv_len,):
        raise ValueError(f"slot ids are one position per slot of the store read, [{kv_len}]; found {tuple(slot_ids.shape)}")
    return slot_ids.to(positions.dtype)[None, :]


def decode_masks(
    positions: torch.Tensor, kv_len: int, window: int | None, ring: int | None, dtype: torch.dtype = torch.float32,
    slot_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks for one new token per row at ``positions`` (after it is written to the store).

    positions: [batch] -> (full [batch, 1, 1, kv_len], sliding [batch, 1, 1, ring or kv_len]).
    ``slot_ids`` [kv_len]: the position each full slot holds (``0..kv_len-1``), given as an input by a
    graph that is keyed by its KV length (:attr:`~neuron_port.graph.graphs.StaticLMGraph.slot_input`).
    """
    slots = _slot_row(positions, kv_len, slot_ids)
    full = slots <= positions[:, None]
    if window is None:
        sliding = full
    elif ring is None:
        sliding = full & (positions[:, None] - slots < window)
    else:
        held = ring_positions(positions, ring)
        sliding = (held >= 0) & (positions[:, None] - held < window)
    return _additive(full, dtype)[:, None, None, :], _additive(sliding, dtype)[:, None, None, :]


def decode_writes(
    positions: torch.Tensor, kv_len: int, ring: int | None, dtype: torch.dtype = torch.float32,
    slot_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot maps that write the new token's K/V: full [batch, 1, kv_len], sliding [batch, 1, ring]
    (``slot_ids`` as in :func:`decode_masks`)."""
    full = (_slot_row(positions, kv_len, slot_ids) == positions[:, None]).to(dtype)[:, None, :]
    if ring is None:
        return full, full
    ring_slots = torch.arange(ring, device=positions.device)[None, :]
    sliding = (ring_slots == torch.remainder(positions, ring)[:, None]).to(dtype)[:, None, :]
    return full, sliding


def verify_maps(
    positions: torch.Tensor, kv_len: int, window: int | None, ring: int | None, dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masks and write maps of a verify step: ``S`` new tokens per row at consecutive ``positions`` [batch, S]
    (the last accepted token, then the drafted ones), all written before any is attended.

    Returns (mask full [batch, 1, S, kv_len], mask sliding [batch, 1, S, ring or kv_len], write full [batch, S,
    kv_len], write sliding [batch, S, ring or kv_len]). Query ``i`` sees the slots holding positions up to its own
    (within the window on sliding layers). A position past the store (``>= kv_len``) writes nothing.

    A ring must hold ``window + S - 1`` slots or more (:func:`verify_ring`): writing the step's ``S`` rows first
    then overwrites only positions older than every query's window, and a drafted row that is rejected (written at
    a position the next step writes again) is never read as an older position."""
    check_verify_ring(ring, window, positions.shape[1])
    slots = torch.arange(kv_len, device=positions.device)[None, None, :]
    q = positions[:, :, None]  # [batch, S, 1]
    full = slots <= q
    write_full = (slots == q).to(dtype)
    if window is None:
        sliding, write_sliding = full, write_full
    elif ring is None:
        sliding, write_sliding = full & (q - slots < window), write_full
    else:
        held = ring_positions(positions[:, -1], ring)[:, None, :]  # [batch, 1, ring] after the step's writes
        sliding = (held >= 0) & (held <= q) & (q - held < window)
        ring_slots = torch.arange(ring, device=positions.device)[None, None, :]
        write_sliding = ((ring_slots == torch.remainder(q, ring)) & (q < kv_len)).to(dtype)
    return (_additive(full, dtype)[:, None], _additive(sliding, dtype)[:, None], write_full,
            write_sliding)


def check_verify_ring(ring: int | None, window: int | None, steps: int) -> None:
    """Refuse a ring too small for verify steps of ``steps`` tokens (:func:`verify_maps`)."""
    if ring is not None and window is not None and ring < window + steps - 1:
        raise ValueError(f"a verify step of {steps} tokens needs rings of at least window + {steps - 1} = "
                         f"{window + steps - 1} slots, found {ring}")


def verify_ring(window: int, draft_tokens: int) -> int:
    """Ring slots a sliding owner needs for verify steps of ``draft_tokens + 1`` tokens (:func:`verify_maps`)."""
    return window + draft_tokens


def drafter_view(pending: torch.Tensor, written: torch.Tensor, fed: torch.Tensor, window: int | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions a Gemma-4 drafter reads of its target's store, as transformers' assisted generation hands
    them (``SinglePositionMultiTokenCandidateGenerator`` and ``Gemma4AssistantForCausalLM``'s masks).

    Per row (all [batch], long): ``pending`` the position of the last token seen, not yet fed to the target;
    ``written`` the last position of the row's own tokens the target's latest call wrote (a batched verify step
    also writes padding past it for rows with shorter drafts: no view reaches those); ``fed`` how many of the row's
    positions that call fed (the
    prompt's length for a prefill, 1 for a decode step, the drafts + 1 for a verify step). Full layers read
    positions ``0 .. min(pending, written)``. Sliding layers read what the target's sliding cache returned (its
    ``window - 1`` kept positions and the call's ``fed`` ones), cut to its first ``pending + 1``, then the last
    ``window + 1`` of those (a bidirectional window of distance ``<= window``, flipped to look back).

    Returns (last full position, first sliding position, last sliding position), each [batch]."""
    last_full = torch.minimum(pending, written)
    if window is None:
        return last_full, torch.zeros_like(last_full), last_full
    start = torch.clamp(written + 1 - (window - 1 + fed), min=0)
    last = torch.minimum(written, start + pending)
    return last_full, torch.maximum(start, last - window), last


def drafter_masks(pending: torch.Tensor, written: torch.Tensor, fed: torch.Tensor, kv_len: int, window: int | None,
                  ring: int | None, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive masks of a drafter step over the target's store (:func:`drafter_view`): full [batch, 1, 1, kv_len]
    and sliding [batch, 1, 1, ring or kv_len]. A ring slot is taken to hold the latest position written there up to
    ``written`` (:func:`ring_positions`; a slot padding or a rejected draft wrote later lies outside the view); the
    view fits a ring of ``window + k`` slots after a verify step of up to
    ``k + 1`` tokens, ``k >= 1`` (:func:`verify_ring`)."""
    last_full, first, last = drafter_view(pending, written, fed, window)
    slots = torch.arange(kv_len, device=pending.device)[None, :]
    full = slots <= last_full[:, None]
    held = slots if ring is None else ring_positions(written, ring)
    sliding = (held >= first[:, None]) & (held <= last[:, None]) & (held >= 0)
    return _additive(full, dtype)[:, None, None], _additive(sliding, dtype)[:, None, None]


def last_token_onehot(positions: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """positions [batch, bucket], lengths [batch] -> [batch, bucket] selecting each row's last real
    prompt position (none for a row of length 0)."""
    return (positions == (lengths[:, None] - 1)).to(dtype)


class StepMaps(NamedTuple):
    """What a graph step builds from its inputs (shapes as in :mod:`neuron_port.graph.step`)."""

    mask_full: torch.Tensor  # [batch, 1, seq, kv_len or seq]
    mask_sliding: torch.Tensor  # [batch, 1, seq, ring or seq]
    write_full: torch.Tensor | None  # decode: [batch, 1, kv_len]; None in prefill (its rows go by position)
    write_sliding: torch.Tensor | None  # decode: [batch, 1, ring or kv_len]; None in prefill
    last_onehot: torch.Tensor  # [batch, seq]


def step_maps(
    positions: torch.Tensor, lengths: torch.Tensor, prefill: bool, kv_len: int, window: int | None, ring: int | None,
    dtype: torch.dtype = torch.float32, slot_ids: torch.Tensor | None = None,
) -> StepMaps:
    """Masks, write maps and the last-token pick of one step from its inputs: ``positions`` [batch,
    seq] (a prefill's ``0..seq-1``, the prompt right-padded to ``seq``) and ``lengths`` [batch], how
    many positions each row holds once the step has written (a prefill: its prompt length; a decode
    step: its new token's position + 1). A prefill writes its rows by position
    (:func:`neuron_port.graph.kv.prefill_write`), so it builds no write map. ``slot_ids`` [kv_len]: a decode
    graph's input naming each full slot's position (:func:`decode_masks`); None builds it here."""
    if prefill:
        m_full, m_slide = prefill_masks(positions, window, dtype)
        return StepMaps(m_full, m_slide, None, None, last_token_onehot(positions, lengths, dtype))
    positions = lengths - 1
    m_full, m_slide = decode_masks(positions, kv_len, window, ring, dtype, slot_ids)
    w_full, w_slide = decode_writes(positions, kv_len, ring, dtype, slot_ids)
    last = torch.ones((lengths.shape[0], 1), dtype=dtype, device=lengths.device)
    return StepMaps(m_full, m_slide, w_full, w_slide, last)


__all__ = [
    "drafter_view",
    "drafter_masks",
    "ring_positions",
    "prefill_masks",
    "prefill_writes",
    "decode_masks",
    "decode_writes",
    "last_token_onehot",
    "verify_maps",
    "verify_ring",
    "check_verify_ring",
    "StepMaps",
    "step_maps",
]
