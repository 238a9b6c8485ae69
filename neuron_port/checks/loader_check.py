"""The library's loader against Hugging Face's: every parameter and every buffer, persistent or not.

:func:`loader_mismatches` walks the ``from_pretrained`` model's parameters and buffers
(non-persistent ones included: RoPE tables, embedding scales) and names each tensor of the
library-loaded model that is absent, of another shape or dtype, or different in value, with
both values, for example ``buffer <the word embedding's scale>: -4.03e+32 here, 25.3 in
transformers`` (the message carries the tensor's real name). An empty list means the two loaders built the same model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TensorMismatch:
    """One tensor where the library's model differs from transformers'."""

    kind: str  # "parameter" | "buffer"
    name: str
    problem: str  # "missing here" | "shape" | "dtype" | "values"
    here: str
    transformers: str

    def __str__(self) -> str:
        if self.problem == "missing here":
            return f"{self.kind} {self.name}: missing here, {self.transformers} in transformers"
        return f"{self.kind} {self.name}: {self.here} here, {self.transformers} in transformers"


def _describe(t: torch.Tensor) -> str:
    """A scalar's value, or a tensor's shape and largest magnitude."""
    if t.numel() == 1:
        return f"{t.double().item():.4g}"
    return f"{tuple(t.shape)} max |x| {t.double().abs().max().item():.4g}" if t.numel() else f"{tuple(t.shape)}"


def _tensors(model: nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    out = {name: ("buffer", buf) for name, buf in model.named_buffers() if buf is not None}
    out.update({name: ("parameter", p) for name, p in model.named_parameters(remove_duplicate=False)})
    return out


def loader_mismatches(model: nn.Module, reference: nn.Module, rtol: float = 0.0, atol: float = 0.0,
                      cast: bool = True) -> list[TensorMismatch]:
    """Every tensor of ``reference`` (transformers' ``from_pretrained``) that ``model`` lacks or
    holds differently (beyond ``atol + rtol * |reference|``). ``cast``: a float32 reference's tensor
    is cast to ``model``'s dtype first (a bf16 model holds exactly that cast); without it a dtype
    difference is a finding too (for a reference loaded in the same dtype)."""
    mine, theirs = _tensors(model), _tensors(reference)
    found = []
    for name, (kind, want) in theirs.items():
        if name not in mine:
            found.append(TensorMismatch(kind, name, "missing here", "-", _describe(want)))
            continue
        got = mine[name][1]
        if tuple(got.shape) != tuple(want.shape):
            found.append(TensorMismatch(kind, name, "shape", f"shape {tuple(got.shape)}", f"shape {tuple(want.shape)}"))
            continue
        if got.dtype != want.dtype:
            if not cast:
                found.append(TensorMismatch(kind, name, "dtype", str(got.dtype), str(want.dtype)))
                continue
            if want.is_floating_point():
                want = want.to(got.dtype)  # a model loaded in bf16 holds exactly the cast of transformers' float32
        if torch.equal(got.detach(), want.detach()):  # the common case, in the tensors' own dtype
            continue
        g, w = got.detach().float().cpu(), want.detach().float().cpu()
        if not (atol or rtol) or not bool(((g - w).abs() <= atol + rtol * w.abs()).all()):
            found.append(TensorMismatch(kind, name, "values", _describe(g), _describe(w)))
    return found


def loader_verdict(mismatches: list[TensorMismatch], limit: int = 5) -> str:
    """One line naming the first ``limit`` mismatches (and how many there are in all)."""
    shown = "; ".join(str(m) for m in mismatches[:limit])
    more = f" (and {len(mismatches) - limit} more)" if len(mismatches) > limit else ""
    return f"{len(mismatches)} tensor(s) differ from transformers' from_pretrained: {shown}{more}"


__all__ = ["TensorMismatch", "loader_mismatches", "loader_verdict"]
