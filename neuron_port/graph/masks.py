"""Static masks and one-hot write maps, built on the host for prefill and decode.

Conventions (all consistent with :mod:`neuron_port.graph.kv`):

* A full-attention buffer slot ``s`` holds position ``s``.
* A sliding ring of ``window`` slots holds position ``p`` in slot ``p % window``.
* Hugging Face's sliding attention lets query ``q`` see key ``k`` when ``0 <= q - k < window``.
  ``window=None`` (a model without sliding layers) makes the sliding masks equal the full ones.
* Additive masks: 0 where attention is allowed, the dtype's minimum where it is not.

Prompts are right-padded to the bucket length; ``lengths[b]`` is row b's real length.
"""

from __future__ import annotations

import torch


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype))


def ring_slot(position: int | torch.Tensor, window: int) -> int | torch.Tensor:
    """The ring slot of an absolute position."""
    return position % window


def ring_positions(last: torch.Tensor, window: int) -> torch.Tensor:
    """Absolute position held by each ring slot once positions ``0..last`` are written.

    last: [batch] (long) -> [batch, window]; -1 where a slot was never written.
    """
    slots = torch.arange(window)[None, :]
    held = last[:, None] - torch.remainder(last[:, None] - slots, window)
    return torch.where(held >= 0, held, torch.full_like(held, -1))


def prefill_masks(
    lengths: torch.Tensor, bucket: int, window: int | None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal masks over the padded prompt for full and sliding layers.

    lengths: [batch] -> (full [batch, 1, bucket, bucket], sliding [batch, 1, bucket, bucket]).
    Padded query rows still see themselves, so no row is fully masked.
    """
    q = torch.arange(bucket)[:, None]
    k = torch.arange(bucket)[None, :]
    causal = k <= q
    sliding = causal & (q - k < window) if window is not None else causal
    batch = lengths.shape[0]
    full_m = _additive(causal, dtype).expand(batch, 1, bucket, bucket).clone()
    slide_m = _additive(sliding, dtype).expand(batch, 1, bucket, bucket).clone()
    return full_m, slide_m


def prefill_writes(
    lengths: torch.Tensor, bucket: int, kv_len: int, ring: int | None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot write maps that store a prefilled prompt's K/V.

    Full buffers: step p -> slot p for every real position. Rings: step p -> slot p % ring
    only for the last ``ring`` real positions (older ones would be overwritten anyway).
    ``ring=None`` gives sliding owners a full-length buffer (same map as full layers).

    lengths: [batch] -> (full [batch, bucket, kv_len], sliding [batch, bucket, ring or kv_len]).
    """
    steps = torch.arange(bucket)[None, :]  # [1, bucket]
    real = steps < lengths[:, None]  # [batch, bucket]
    full = (steps[..., None] == torch.arange(kv_len)[None, None, :]) & real[..., None]
    if ring is None:
        return full.to(dtype), full.to(dtype)
    recent = real & (steps >= (lengths[:, None] - ring))
    slots = torch.remainder(steps, ring)
    sliding = (slots[..., None] == torch.arange(ring)[None, None, :]) & recent[..., None]
    return full.to(dtype), sliding.to(dtype)


def decode_masks(
    positions: torch.Tensor, kv_len: int, window: int | None, ring: int | None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks for one new token per row at ``positions`` (after it is written to the store).

    positions: [batch] -> (full [batch, 1, 1, kv_len], sliding [batch, 1, 1, ring or kv_len]).
    """
    slots = torch.arange(kv_len)[None, :]
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
    positions: torch.Tensor, kv_len: int, ring: int | None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot maps that write the new token's K/V: full [batch, 1, kv_len], sliding [batch, 1, ring]."""
    full = (torch.arange(kv_len)[None, :] == positions[:, None]).to(dtype)[:, None, :]
    if ring is None:
        return full, full
    sliding = (torch.arange(ring)[None, :] == torch.remainder(positions, ring)[:, None]).to(dtype)[:, None, :]
    return full, sliding


def last_token_onehot(lengths: torch.Tensor, bucket: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[batch, bucket] selecting each row's last real prompt position."""
    return (torch.arange(bucket)[None, :] == (lengths[:, None] - 1)).to(dtype)


__all__ = [
    "ring_slot",
    "ring_positions",
    "prefill_masks",
    "prefill_writes",
    "decode_masks",
    "decode_writes",
    "last_token_onehot",
]
