"""Only the family adapters name Hugging Face attributes.

A grep over the library (and the example recipes) outside ``neuron_port/families/`` for the
module and config attribute names of the supported families, plus an AST check that no code
reads a config attribute other than ``model_type`` (the key that picks the adapter).
"""


from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import ROOT

# Module attributes (Gemma-4, Llama, Qwen3) and config fields that only an adapter may spell.
HF_NAMES = (
    "self_attn", "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "gate_proj", "up_proj", "down_proj",
    "embed_tokens", "embed_tokens_per_layer", "lm_head", "layer_scalar", "rotary_emb", "input_layernorm",
    "post_attention_layernorm", "language_model", "text_config", "per_layer_config", "per_layer_inputs",
    "embed_scale", "num_key_value_heads", "num_attention_heads", "num_hidden_layers", "num_key_value_groups",
    "layer_types", "kv_sharing_modes", "num_kv_shared_layers", "hidden_size_per_layer_input",
    "final_logit_softcapping", "attention_k_eq_v", "use_double_wide_mlp", "max_window_layers",
    "use_sliding_window", "rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings",
    "bos_token_id", "eos_token_id", "pad_token_id", "rms_norm_eps", "_attn_implementation", "inv_freq",
)
PATTERN = re.compile(r"\b(" + "|".join(HF_NAMES) + r")\b|model\.layers\.")


def _files() -> list[Path]:
    lib = [p for p in (ROOT / "neuron_port").rglob("*.py") if "families" not in p.relative_to(ROOT / "neuron_port").parts]
    return sorted(lib) + sorted((ROOT / "examples").glob("*.py"))


def test_the_scan_covers_the_library_and_sees_the_adapters():
    files = _files()
    assert len(files) > 30
    # the adapters do name these (so the pattern is live), and they are excluded from the scan
    adapters = "".join(p.read_text() for p in (ROOT / "neuron_port" / "families").glob("*.py"))
    for name in ("q_proj", "layer_scalar", "num_key_value_heads", "embed_tokens", "language_model"):
        assert PATTERN.search(adapters) and name in adapters


def test_no_hugging_face_attribute_names_outside_the_adapters():
    hits = []
    for path in _files():
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            m = PATTERN.search(line)
            if m:
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {m.group(0)}")
    assert not hits, "Hugging Face names outside neuron_port/families:\n" + "\n".join(hits)


def test_no_config_attribute_reads_outside_the_adapters():
    hits = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr != "model_type":
                base = node.value
                name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
                if name.endswith("config"):
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}.{node.attr}")
    assert not hits, "config attributes read outside neuron_port/families:\n" + "\n".join(hits)
