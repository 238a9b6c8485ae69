"""Shipped Gemma-4 text configs, local config loading, and the ``tiny`` shrinking.

No model hub is reachable from the machines this library is built and tested on, so the real
configs of the three models travel with the package (values from the checkpoint headers). A
real ``config.json`` always wins: :func:`load_config` accepts a shipped name, a path to a
``config.json`` or a model directory holding one (multimodal wrapper configs with a
``text_config`` work too).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from neuron_port.errors import ConfigError
from neuron_port.families import family_for

SHIPPED = ("gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b")

# Tiny variants use a larger initializer range than the real 0.02 so that random weights give
# decisive logits (large top-1/top-2 gaps). Chosen once for all tiny variants; see tests.
TINY_INITIALIZER_RANGE = 1.0
TINY_VOCAB = 512
TINY_HIDDEN = 64
TINY_HEAD_DIM = 16
TINY_INTERMEDIATE = 128
TINY_PER_LAYER_INPUT = 8


def shipped_names() -> list[str]:
    return list(SHIPPED)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"malformed JSON in {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object, found {type(data).__name__}")
    return data


def load_config_dict(name_or_path: str | Path) -> dict[str, Any]:
    """The text config dict of a shipped name, a ``config.json`` path or a model directory."""
    name = str(name_or_path)
    if name in SHIPPED:
        with resources.files(__package__).joinpath(f"{name}.json").open("r", encoding="utf-8") as fh:
            raw = json.load(fh)
    else:
        path = Path(name)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(
                f"no config found for {name!r}: expected one of the shipped names "
                f"({', '.join(SHIPPED)}), a config.json file or a directory holding one"
            )
        raw = _read_json(path)
    family = family_for(raw.get("model_type"))
    return family.text_config_dict(raw)


def tiny_config_dict(text: dict[str, Any]) -> dict[str, Any]:
    """Shrink a real text config, keeping every architectural feature.

    Kept: the layer-type pattern rule (full every ``period`` layers), KV sharing with both a
    sliding and a full shared layer, the real q/kv head counts (and the global KV-head count
    with ``attention_k_eq_v``), global head_dim = 2 x head_dim, per-layer embeddings and the
    double-wide MLP where present, the softcap and tied embeddings. The sliding window shrinks
    to 8 (or 16 for a 1024 window) so that short tests cross it.
    """
    types = list(text["layer_types"])
    period = types.index("full_attention") + 1
    for i, t in enumerate(types):
        if (t == "full_attention") != (i % period == period - 1):
            raise ConfigError(f"layer types do not follow one period-{period} rule at layer {i}")
    n_layers = 2 * period
    tiny = dict(text)
    tiny.update(
        vocab_size=TINY_VOCAB,
        hidden_size=TINY_HIDDEN,
        intermediate_size=TINY_INTERMEDIATE,
        num_hidden_layers=n_layers,
        head_dim=TINY_HEAD_DIM,
        global_head_dim=2 * TINY_HEAD_DIM,
        layer_types=["full_attention" if i % period == period - 1 else "sliding_attention" for i in range(n_layers)],
        sliding_window=16 if int(text["sliding_window"]) >= 1024 else 8,
        num_kv_shared_layers=(period - 1) if int(text.get("num_kv_shared_layers", 0)) else 0,
        max_position_embeddings=4096,
        initializer_range=TINY_INITIALIZER_RANGE,
    )
    if int(text.get("hidden_size_per_layer_input", 0) or 0):
        tiny.update(hidden_size_per_layer_input=TINY_PER_LAYER_INPUT, vocab_size_per_layer_input=TINY_VOCAB)
    return tiny


def load_config(name_or_path: str | Path, tiny: bool = False) -> Any:
    """A Hugging Face text config object (``Gemma4TextConfig`` or the unified one)."""
    text = load_config_dict(name_or_path)
    if tiny:
        text = tiny_config_dict(text)
    return family_for(text["model_type"]).make_config(text)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-able text config dict that :func:`load_config` reads back to the same config."""
    data = config.to_dict()
    data.pop("per_layer_config", None)
    per_layer = config.per_layer_config
    full = [i for i, t in enumerate(config.layer_types) if t == "full_attention"]
    if full:
        data["global_head_dim"] = int(per_layer[full[0]].head_dim)
        if getattr(config, "attention_k_eq_v", False):
            data["num_global_key_value_heads"] = int(per_layer[full[0]].num_key_value_heads)
    data["model_type"] = config.model_type
    for key in ("transformers_version", "_name_or_path", "dtype", "architectures"):
        data.pop(key, None)
    return data


__all__ = ["SHIPPED", "load_config", "load_config_dict", "tiny_config_dict", "config_to_dict", "shipped_names"]
