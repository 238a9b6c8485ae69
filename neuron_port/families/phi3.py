"""Adapter for Phi-3 (``Phi3ForCausalLM``): fused projections, the worked example of the fused case.

Phi-3 computes q, k and v with one ``qkv_proj`` (rows: every query head, then every KV head of
K, then of V) and gate and up with one ``gate_up_proj`` (rows: gate, then up). The adapter gives
the sharding math a :class:`~neuron_port.families.decoder.RoleView` of each role's rows, and
re-fuses a rank's pieces in :meth:`Phi3Family.set_attention_projections` /
:meth:`Phi3Family.set_mlp_projections`, in the same order. Phi-3's attention splits the fused
output with ``config.num_attention_heads`` (its config, shared by every layer), so each sharded
attention module gets a config copy of its own with the rank's head counts; the graphs then set
the library's attention function on every config copy (``DecoderFamily.use_attention``).

With a ``sliding_window`` every layer slides, and ``Phi3Model`` takes one 4-D mask, as Mistral's.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from neuron_port.errors import AdapterError
from neuron_port.families.decoder import DecoderFamily
from neuron_port.families.mistral import MistralFamily
from neuron_port.families.parts import RoleConcat, RoleView


def _fused(roles: dict[str, nn.Module]) -> nn.Module:
    """One module computing ``roles`` (in order) fused: a plain ``nn.Linear`` of their stacked rows, or,
    where any role is another kind of layer (neuronx-distributed's parallel layers), a :class:`RoleConcat`."""
    modules = list(roles.values())
    if any(type(m) is not nn.Linear for m in modules):
        return RoleConcat(roles)
    weight = torch.cat([m.weight for m in modules], dim=0)
    biases = [m.bias for m in modules]
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=biases[0] is not None, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if biases[0] is not None:
            fused.bias.copy_(torch.cat(biases))
    return fused.requires_grad_(False)


class Phi3Family(DecoderFamily):
    name = "phi3"
    text_types = ("phi3",)
    model_types = ("phi3",)
    config_classes = {"phi3": ("transformers", "Phi3Config")}
    causal_lm_classes = {"phi3": ("transformers", "Phi3ForCausalLM")}
    fused_projections = True
    tiny_heads = (6, 3)  # GQA (as Phi-3-medium's 40/10) that straddles KV groups at tp 2
    chat_stop_tokens = ("<|end|>",)

    # Phi-3 is Mistral's mask story: every layer slides when there is a window.
    layer_types = MistralFamily.layer_types
    attention_mask_argument = MistralFamily.attention_mask_argument

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """The common tiny shape with 6 q / 3 kv heads of 16 (hidden 96), a window of 8."""
        tiny = super().tiny_config_dict(text)
        q_heads = self.tiny_heads[0]
        tiny.update(hidden_size=q_heads * tiny["head_dim"], sliding_window=8 if text.get("sliding_window") else None)
        tiny.pop("head_dim")  # Phi-3 derives it: hidden / query heads
        return tiny

    def head_dim(self, config: Any, index: int) -> int:
        return int(config.hidden_size) // int(config.num_attention_heads)

    # ---- the fused projections ---------------------------------------------------------------
    def attention_projections(self, attn: nn.Module) -> dict[str, nn.Module | RoleView | None]:
        """q, k, v as views of ``qkv_proj``'s rows (as many heads as the module computes now); o itself."""
        d, q_rows = attn.head_dim, attn.config.num_attention_heads * attn.head_dim
        kv_rows = attn.num_key_value_heads * d
        w, b = attn.qkv_proj.weight, attn.qkv_proj.bias
        spans = {"q": (0, q_rows), "k": (q_rows, q_rows + kv_rows), "v": (q_rows + kv_rows, q_rows + 2 * kv_rows)}
        views: dict[str, nn.Module | RoleView | None] = {
            role: RoleView(w[a:z], b[a:z] if b is not None else None) for role, (a, z) in spans.items()}
        views["o"] = attn.o_proj
        return views

    def set_attention_projection(self, attn: nn.Module, role: str, module: nn.Module) -> None:
        raise AdapterError("Phi-3's q, k and v share one fused module: install them together with "
                           "set_attention_projections")

    def set_mlp_projection(self, mlp: nn.Module, role: str, module: nn.Module) -> None:
        raise AdapterError("Phi-3's gate and up share one fused module: install them together with set_mlp_projections")

    def set_attention_projections(self, attn: nn.Module, modules: dict[str, nn.Module]) -> None:
        """Re-fuse a rank's q, k, v into ``qkv_proj`` (q rows, then k, then v) and give the module
        a config copy with the rank's head counts (its forward splits the fused output by them)."""
        attn.qkv_proj = _fused({role: modules[role] for role in ("q", "k", "v")})
        attn.o_proj = modules["o"]
        q_heads = modules["q"].weight.shape[0] // attn.head_dim
        kv_heads = modules["k"].weight.shape[0] // attn.head_dim
        attn.config = copy.deepcopy(attn.config)
        attn.config.num_attention_heads, attn.config.num_key_value_heads = q_heads, kv_heads
        attn.num_key_value_heads = kv_heads
        attn.num_key_value_groups = max(1, q_heads // kv_heads)

    def mlp_projections(self, mlp: nn.Module) -> dict[str, nn.Module | RoleView]:
        """gate and up as views of ``gate_up_proj``'s two halves; down itself."""
        w, b = mlp.gate_up_proj.weight, mlp.gate_up_proj.bias
        half = w.shape[0] // 2
        return {"gate": RoleView(w[:half], b[:half] if b is not None else None),
                "up": RoleView(w[half:], b[half:] if b is not None else None), "down": mlp.down_proj}

    def set_mlp_projections(self, mlp: nn.Module, modules: dict[str, nn.Module]) -> None:
        """Re-fuse a rank's gate and up into ``gate_up_proj`` (gate rows first: its forward chunks in two)."""
        mlp.gate_up_proj = _fused({role: modules[role] for role in ("gate", "up")})
        mlp.down_proj = modules["down"]

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """Phi-3's turns: ``<|role|>`` newline content ``<|end|>`` newline; the assistant's opening last."""
        turns = [f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages]
        return "".join(turns) + "<|assistant|>\n"


PHI3 = Phi3Family()
