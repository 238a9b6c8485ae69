"""Adapter for Gemma-3 text (``Gemma3ForCausalLM``): 5 sliding layers to 1 full, two RoPE bases, scaled embeddings.

What the library must know: the layer types (from ``sliding_window_pattern``), that the word
embedding is scaled by sqrt(hidden) inside Hugging Face's embedding module (the host gather must
scale it too, or every activation is off by that factor), and the final logit softcap when the
config sets one. Queries are scaled by ``query_pre_attn_scalar`` and each layer type has its own
RoPE base; Hugging Face's attention modules do both. Turns use Gemma's chat format.
"""

from __future__ import annotations

from typing import Any

from neuron_port.families.decoder import DecoderFamily
from neuron_port.families.gemma4 import GEMMA_CHAT_STOP_TOKENS, gemma_chat_prompt
from neuron_port.families.parts import TINY_HEAD_DIM


class Gemma3Family(DecoderFamily):
    name = "gemma3"
    text_types = ("gemma3_text",)
    model_types = ("gemma3_text",)
    config_classes = {"gemma3_text": ("transformers", "Gemma3TextConfig")}
    causal_lm_classes = {"gemma3_text": ("transformers", "Gemma3ForCausalLM")}
    tiny_heads = (4, 2)
    tiny_layers = 6  # one full layer after five sliding ones
    chat_stop_tokens = GEMMA_CHAT_STOP_TOKENS

    def tiny_config_dict(self, text: dict[str, Any]) -> dict[str, Any]:
        """The common tiny shape, six layers of the 5:1 pattern, a window of 8, queries scaled by the tiny head size.

        The LM head is untied: with random tables tied to a sqrt(hidden)-scaled embedding, greedy
        decoding picks the same largest-norm row at every step and tokens could show nothing."""
        return {**super().tiny_config_dict(text), "sliding_window": 8, "sliding_window_pattern": 6,
                "query_pre_attn_scalar": TINY_HEAD_DIM, "tie_word_embeddings": False}

    def softcap(self, config: Any) -> float | None:
        value = getattr(config, "final_logit_softcapping", None)
        return float(value) if value else None

    def embedding_scales(self, config: Any) -> tuple[float | None, float | None]:
        return float(self.hidden_size(config)) ** 0.5, None

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return gemma_chat_prompt(messages)


GEMMA3 = Gemma3Family()
