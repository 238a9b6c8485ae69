"""Host-side logits handling: the softcap lives here, not in the device graph.

The graphs end at raw logits. Gemma's final softcap ``c * tanh(x / c)`` is strictly
increasing, so ``argmax(softcap(x)) == argmax(x)`` and greedy decoding never needs it; only
sampling (temperature > 0) applies it, and only to the candidates sampling keeps.
"""

from __future__ import annotations

import torch


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(logits / cap)`` computed as Hugging Face does; identity for ``cap=None``."""
    if not cap:
        return logits
    return torch.tanh(logits / cap) * cap


__all__ = ["softcap"]
