"""Adapter for Mistral (``MistralForCausalLM``): GQA where every layer slides when the config has a window.

The common decoder shape, with one difference the library must know: with ``sliding_window``
set, every layer attends a window (the store keeps rings of it) and ``MistralModel`` takes one
4-D mask, the sliding one.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_port.families.decoder import DecoderFamily


class MistralFamily(DecoderFamily):
    name = "mistral"
    text_types = ("mistral",)
    model_types = ("mistral",)
    config_classes = {"mistral": ("transformers", "MistralConfig")}
    causal_lm_classes = {"mistral": ("transformers", "MistralForCausalLM")}
    tiny_heads = (4, 2)  # 4:1 as Mistral-7B's 32/8; 2 KV heads are fewer than tp 4
    chat_stop_tokens = ("</s>",)

    def layer_types(self, config: Any) -> list[str]:
        kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
        return [kind] * self.num_layers(config)

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """The common tiny shape with a window of 8, so that short prompts cross it."""
        return {**super().tiny_config_dict(text), "sliding_window": 8 if text.get("sliding_window") else None}

    def attention_mask_argument(self, masks: dict[str, torch.Tensor]) -> Any:
        """One 4-D mask: the sliding one (it equals the full one when there is no window)."""
        return masks["sliding"]

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """Mistral's instruction format: ``[INST] user [/INST]`` then the answer and ``</s>``;
        system content joins the first user turn."""
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        parts = []
        for m in messages:
            if m["role"] == "user":
                content, system = (f"{system}\n\n{m['content']}" if system else m["content"]), ""
                parts.append(f"[INST] {content} [/INST]")
            elif m["role"] == "assistant":
                parts.append(f"{m['content']}</s>")
        return "".join(parts)


MISTRAL = MistralFamily()
