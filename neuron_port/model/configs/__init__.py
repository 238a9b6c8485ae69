"""Shipped text configs, local config loading, and the ``tiny`` shrinking.

No model hub is reachable from the machines this library is built and tested on, so the real
configs travel with the package: the three Gemma-4 models, and one model each of Llama, Qwen3,
Mistral, Qwen2, Gemma-3 (text) and Phi-3. A
real ``config.json`` always wins: :func:`load_config` accepts a shipped name, a path to a
``config.json`` or a model directory holding one (multimodal wrapper configs work too: the
family adapter takes their text part).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from neuron_port.errors import ConfigError
from neuron_port.families import family_for

# Shipped name -> config file. The Gemma-4 values come from the checkpoint headers; the others
# reproduce the public config.json of Llama-3.2-1B, Qwen3-0.6B, Mistral-7B-v0.1, Qwen2-0.5B,
# Gemma-3-1B (text) and Phi-3-mini-4k.
_SHIPPED_FILES = {
    "gemma-4-e2b": "gemma-4-e2b.json",
    "gemma-4-e4b": "gemma-4-e4b.json",
    "gemma-4-12b": "gemma-4-12b.json",
    "llama": "llama-3.2-1b.json",
    "qwen3": "qwen3-0.6b.json",
    "mistral": "mistral-7b-v0.1.json",
    "qwen2": "qwen2-0.5b.json",
    "gemma-3": "gemma-3-1b.json",
    "phi-3": "phi-3-mini-4k.json",
}
SHIPPED = tuple(_SHIPPED_FILES)

HUB_IDS = {
    "gemma-4-e2b": "google/gemma-4-E2B-it",
    "gemma-4-e4b": "google/gemma-4-E4B-it",
    "gemma-4-12b": "google/gemma-4-12B-it",
    "llama": "meta-llama/Llama-3.2-1B-Instruct",
    "qwen3": "Qwen/Qwen3-0.6B",
    "mistral": "mistralai/Mistral-7B-v0.1",
    "qwen2": "Qwen/Qwen2-0.5B-Instruct",
    "gemma-3": "google/gemma-3-1b-it",
    "phi-3": "microsoft/Phi-3-mini-4k-instruct",
}
"""Shipped name -> the Hugging Face id of the checkpoint whose config it reproduces (its real weights)."""


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
        with resources.files(__package__).joinpath(_SHIPPED_FILES[name]).open("r", encoding="utf-8") as fh:
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
    """Shrink a real text config, keeping every architectural feature of its family.

    Each family adapter says what its tiny variant keeps (``tiny_config_dict`` there).
    """
    return family_for(text.get("model_type")).tiny_config_dict(text)


def load_config(name_or_path: str | Path, tiny: bool = False) -> Any:
    """A Hugging Face text config object of the name's family (``Gemma4TextConfig``, ``LlamaConfig`` ...)."""
    text = load_config_dict(name_or_path)
    if tiny:
        text = tiny_config_dict(text)
    try:
        return family_for(text["model_type"]).make_config(text)
    except Exception as exc:  # noqa: BLE001 - HF validators raise ValueError, TypeError or hub's own errors
        reason = str(exc).replace("\n", " ").strip()
        raise ConfigError(f"{name_or_path}: not a valid {text['model_type']} config: {reason}") from None


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-able text config dict that :func:`load_config` reads back to the same config."""
    return family_for(config.model_type).config_to_dict(config)


__all__ = ["SHIPPED", "HUB_IDS", "load_config", "load_config_dict", "tiny_config_dict", "config_to_dict", "shipped_names"]
