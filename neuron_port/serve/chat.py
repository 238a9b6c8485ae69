"""Chat prompts and stop tokens from the model's own files, never from another family's.

The format comes from ``chat_template`` in the model's ``tokenizer_config.json`` when it has
one (a Jinja template, rendered with ``add_generation_prompt``), otherwise from the family
adapter's default (:meth:`~neuron_port.families.decoder.DecoderFamily.chat_prompt`). Turn-ending
tokens come from the tokenizer config's ``eos_token`` and the adapter's ``chat_stop_tokens``,
resolved to ids through the tokenizer. BOS is the config's id, prepended only when the
tokenizer does not add it itself (:func:`neuron_port.prompts.bos_prefix`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_port.families import DecoderFamily
from neuron_port.families.gemma4 import gemma_chat_prompt  # deprecated here, kept for one release


def tokenizer_config(directory: str | Path | None) -> dict[str, Any]:
    """``tokenizer_config.json`` of a model or artifact directory ({} when absent or unreadable)."""
    if directory is None:
        return {}
    path = Path(directory) / "tokenizer_config.json"
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChatFormat:
    """How chat messages become a prompt, and which tokens end the assistant's turn."""

    family: DecoderFamily
    template: str | None
    stop_ids: tuple[int, ...]

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text up to the assistant's turn (BOS not included)."""
        if self.template:
            from jinja2 import Template

            return Template(self.template).render(messages=messages, add_generation_prompt=True, bos_token="")
        text = self.family.chat_prompt(messages)
        if text is None:
            raise ValueError(f"this model has no chat template (no chat_template in tokenizer_config.json and no "
                             f"default format for the {self.family.name} family): use /v1/completions")
        return text


def chat_format(family: DecoderFamily, tokenizer: Any, directory: str | Path | None) -> ChatFormat:
    """The chat format of a model: its tokenizer files first, its family adapter second."""
    settings = tokenizer_config(directory)
    template = settings.get("chat_template") if isinstance(settings.get("chat_template"), str) else None
    names = [t for t in (_token_text(settings.get("eos_token")), *family.chat_stop_tokens) if t]
    ids = [tokenizer.token_to_id(name) for name in names] if tokenizer is not None else []
    return ChatFormat(family, template, tuple(dict.fromkeys(i for i in ids if i is not None)))


__all__ = ["tokenizer_config", "ChatFormat", "chat_format", "gemma_chat_prompt"]
