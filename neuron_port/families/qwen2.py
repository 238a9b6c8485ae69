"""Adapter for Qwen2 (``Qwen2ForCausalLM``): Qwen3's shape with biases on q, k and v and no q/k norms.

The biases are split with their heads by the sharding (each rank keeps its heads' bias rows);
nothing else differs from :class:`~neuron_port.families.qwen3.Qwen3Family`.
"""

from __future__ import annotations

from neuron_port.families.qwen3 import Qwen3Family


class Qwen2Family(Qwen3Family):
    name = "qwen2"
    text_types = ("qwen2",)
    model_types = ("qwen2",)
    config_classes = {"qwen2": ("transformers", "Qwen2Config")}
    causal_lm_classes = {"qwen2": ("transformers", "Qwen2ForCausalLM")}
    tiny_heads = (4, 2)  # 7:1 in Qwen2-0.5B (14/2) does not split at tp 2; 2:1 keeps GQA and splits


QWEN2 = Qwen2Family()
