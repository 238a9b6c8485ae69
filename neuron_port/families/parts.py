"""Small values every family adapter shares: projection roles, fused-weight views (and the module
that computes a fused projection from its roles' own layers), special ids, and the sizes of the tiny
variants."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

ATTENTION_ROLES = ("q", "k", "v", "o")
MLP_ROLES = ("gate", "up", "down")

# Sizes shared by every family's tiny variant. The initializer range is larger than the real
# 0.02 so that random weights give decisive logits (large top-1/top-2 gaps).
TINY_INITIALIZER_RANGE = 1.0
TINY_VOCAB = 512
TINY_HIDDEN = 64
TINY_HEAD_DIM = 16
TINY_INTERMEDIATE = 128
TINY_PER_LAYER_INPUT = 8
# Special ids of the demo tokenizer (neuron_port.model.localdir): pad 0, eos 1, bos 2.
TINY_SPECIAL_IDS = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


@dataclass(frozen=True)
class RoleView:
    """One role's weight [out, in] and bias [out], viewed out of a fused projection (Phi-3's
    ``qkv_proj`` and ``gate_up_proj``): what the sharding math reads where no module of its own exists."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]


class RoleConcat(nn.Module):
    """A fused projection computed from one layer per role: ``forward(x) = cat([role(x) ...], -1)``.

    x: [..., in] -> [..., sum of the roles' out]. Where a fused module (Phi-3's ``qkv_proj``) must be
    built from layers that cannot be concatenated into one weight (neuronx-distributed's parallel
    layers, which hold this rank's rows and load their own shards), each role keeps its layer,
    named by the role (``qkv_proj.q``, ``qkv_proj.k``, ...), and the outputs are concatenated in the
    fused row order, which is what the model's forward splits."""

    def __init__(self, roles: dict[str, nn.Module]):
        super().__init__()
        self.roles = tuple(roles)
        for role, module in roles.items():
            self.add_module(role, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([getattr(self, role)(x) for role in self.roles], dim=-1)


@dataclass(frozen=True)
class SpecialIds:
    """Token ids the runtime needs: ``bos`` (None when the family adds none) and every ``eos``."""

    bos: int | None
    eos: tuple[int, ...]
    pad: int | None


__all__ = ["ATTENTION_ROLES", "MLP_ROLES", "RoleView", "RoleConcat", "SpecialIds", "TINY_INITIALIZER_RANGE", "TINY_VOCAB",
           "TINY_HIDDEN", "TINY_HEAD_DIM", "TINY_INTERMEDIATE", "TINY_PER_LAYER_INPUT", "TINY_SPECIAL_IDS"]
