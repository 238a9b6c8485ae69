"""Adapter for Qwen3 (``Qwen3ForCausalLM``): GQA with per-head RMSNorm on queries and keys.

The q/k norms act on ``head_dim`` inside each head, so head-wise sharding leaves them whole
(every rank keeps the full norm weights); nothing else differs from the common decoder shape.
Qwen3 can declare sliding-window layers (``use_sliding_window``); the shipped checkpoints do
not, and the adapter reads whatever ``layer_types`` the config has.
"""

from __future__ import annotations

from typing import Any

from neuron_port.families.decoder import DecoderFamily


class Qwen3Family(DecoderFamily):
    name = "qwen3"
    text_types = ("qwen3",)
    model_types = ("qwen3",)
    config_classes = {"qwen3": ("transformers", "Qwen3Config")}
    causal_lm_classes = {"qwen3": ("transformers", "Qwen3ForCausalLM")}
    # 2 query heads per KV head, as in Qwen3-0.6B (16/8); 2 KV heads are fewer than tp 4.
    tiny_heads = (4, 2)

    chat_stop_tokens = ("<|im_end|>",)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """ChatML: each turn ``<|im_start|>role``, a newline, the content and ``<|im_end|>``; the
        assistant's opening last."""
        turns = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
        return "".join(turns) + "<|im_start|>assistant\n"

    def sliding_window(self, config: Any) -> int | None:
        if not getattr(config, "use_sliding_window", False):
            return None
        return super().sliding_window(config)

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """The common tiny shape (4 q / 2 kv heads of 16, q/k norms kept) with
        ``max_window_layers`` at the tiny layer count: no layer slides unless a caller lowers it."""
        return {**super().tiny_config_dict(text), "max_window_layers": self.tiny_layers}


QWEN3 = Qwen3Family()
