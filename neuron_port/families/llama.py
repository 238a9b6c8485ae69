"""Adapter for Llama (``LlamaForCausalLM``): plain GQA, every layer full attention, no KV sharing.

Llama is the common decoder shape itself, so the adapter only names its classes, its tiny
variant and the one form of input its text model differs in. It is the reuse proof's
baseline: if a primitive needed a Llama special case, that special case would belong in the
Gemma adapter instead.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_port.families.decoder import DecoderFamily


class LlamaFamily(DecoderFamily):
    name = "llama"
    text_types = ("llama",)
    model_types = ("llama",)
    config_classes = {"llama": ("transformers", "LlamaConfig")}
    causal_lm_classes = {"llama": ("transformers", "LlamaForCausalLM")}
    # 4 query heads per KV head, as in Llama-3.2-1B (32/8); 2 KV heads are fewer than tp 4.
    tiny_heads = (8, 2)
    tiny_max_positions = 16384  # above the RoPE scaling's original 8192

    chat_stop_tokens = ("<|eot_id|>",)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """Llama-3's header format: each turn ``<|start_header_id|>role<|end_header_id|>`` then a
        blank line, the content and ``<|eot_id|>``; the assistant header last."""
        turns = [f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in messages]
        return "".join(turns) + "<|start_header_id|>assistant<|end_header_id|>\n\n"

    def attention_mask_argument(self, masks: dict[str, torch.Tensor]) -> Any:
        """``LlamaModel`` takes one 4-D mask (used as is); every layer is full attention."""
        return masks["full"]


LLAMA = LlamaFamily()
