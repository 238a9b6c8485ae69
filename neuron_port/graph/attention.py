"""The attention function the static graphs use: eager math plus a static KV-head gather.

Registered with Hugging Face's attention interface as ``neuron_port_eager``. It is plain
matmul / mask / softmax / matmul (no fused kernel, which overflows the Neuron compiler's SBUF
for long sliding windows). When a tensor-parallel rank's query heads do not map uniformly
onto its KV heads, the graph passes the one-hot matrix ``[local_q, local_kv]`` of each such
attention module explicitly, as the keyword argument ``KV_EXPAND`` (a mapping from the module
to its matrix; Hugging Face hands a model's extra keyword arguments down to this function), and
K/V are expanded by a matmul with it: a static, trace-safe gather. Otherwise each KV head serves
its ``local_q / local_kv`` query heads (read from the tensor shapes) in Hugging Face's
``repeat_kv`` order, without materialising the repeated K/V. Nothing here reads a module
attribute of a particular family, so every family's attention modules can call it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from neuron_port.errors import MaskFormError

NAME = "neuron_port_eager"
KV_EXPAND = "neuron_port_kv_expand"
"""Keyword argument carrying ``{attention module: [local_q, local_kv] one-hot}`` for straddling ranks."""

_RECORDINGS: list[set[int]] = []
_RECORDINGS_LOCK = threading.Lock()


@contextmanager
def recording() -> Iterator[set[int]]:
    """A set that collects ``id(module)`` of every attention module that calls :func:`static_attention`
    while the block runs (eagerly; a traced graph runs no Python). The self-check's sentinel: it
    shows which layers really run this function, whatever their configs say."""
    seen: set[int] = set()
    with _RECORDINGS_LOCK:
        _RECORDINGS.append(seen)
    try:
        yield seen
    finally:
        with _RECORDINGS_LOCK:
            _RECORDINGS.remove(seen)


def expand_kv(states: torch.Tensor, expand: torch.Tensor) -> torch.Tensor:
    """The static gather of a straddling rank: states [batch, local_kv, seq, head_dim] and the
    one-hot ``expand`` [local_q, local_kv] -> [batch, local_q, seq, head_dim]."""
    return torch.einsum("qk,bksd->bqsd", expand.to(states.dtype), states)


def static_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [b, q_heads, q_len, d], key/value [b, kv_heads, kv_len, d], mask [b, 1, q_len, kv_len].

    Returns ([b, q_len, q_heads, d], attention weights).
    """
    if _RECORDINGS:
        with _RECORDINGS_LOCK:
            for seen in _RECORDINGS:
                seen.add(id(module))
    if attention_mask is None:
        # The static graphs always hand over the masks they build. None means the text model
        # dropped them (a family adapter gave the mask in a form its model ignores), and
        # attention would silently see every slot, padding and stale ring entries included.
        raise MaskFormError("neuron_port_eager attention got no mask: the family adapter's attention_mask_argument "
                            "passes the masks in a form this text model does not use (a model whose forward builds "
                            "one causal mask, as Llama's, takes masks['full'] or masks['sliding'] itself)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    expand = (kwargs.get(KV_EXPAND) or {}).get(module)
    if expand is not None:
        key, value = expand_kv(key, expand), expand_kv(value, expand)
    elif query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads do not divide evenly over {key.shape[1]} KV heads "
                         f"and no {KV_EXPAND} gather was passed for this attention module")
    return _grouped_attention(query, key, value, attention_mask, scaling, softcap)


def _grouped_attention(query, key, value, attention_mask, scaling, softcap):
    """Eager attention with each KV head read once for its whole group of query heads.

    Query head ``h`` attends KV head ``h // groups`` (Hugging Face's ``repeat_kv`` order), so the
    query [b, kv * groups, L, d] is regrouped as [b, kv, groups * L, d] and multiplied with
    K [b, kv, S, d] directly: no [b, q_heads, S, d] copy of the KV store per layer and step.
    """
    b, hq, q_len, d = query.shape
    hkv, kv_len = key.shape[1], key.shape[2]
    grouped = query.reshape(b, hkv, (hq // hkv) * q_len, d)
    scores = torch.matmul(grouped, key.transpose(2, 3)).view(b, hq, q_len, kv_len) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights.view(b, hkv, (hq // hkv) * q_len, kv_len), value).view(b, hq, q_len, d)
    return out.transpose(1, 2).contiguous(), weights


def register() -> str:
    """Register the function with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, static_attention)
    return NAME


__all__ = ["NAME", "KV_EXPAND", "static_attention", "expand_kv", "recording", "register"]
