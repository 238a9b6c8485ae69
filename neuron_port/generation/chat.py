"""Chat prompts and stop tokens from the model's own files, rendered as transformers renders them.

The template comes from ``chat_template.jinja`` (where transformers 5 writes it) or from
``chat_template`` in ``tokenizer_config.json``; without either, from the family adapter's
default (:meth:`~neuron_port.families.decoder.DecoderFamily.chat_prompt`). A template is
rendered the way ``apply_chat_template(add_generation_prompt=True)`` renders it: a sandboxed
Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, loop controls, ``raise_exception``,
``strftime_now`` and an unescaped ``tojson``, the tokenizer's special tokens as variables; the
text is then tokenized with no special tokens added (the template writes BOS if the model wants
one). Turn-ending tokens: ``generation_config.json``'s end-of-sequence ids (read by the family
adapter, :meth:`~neuron_port.families.decoder.DecoderFamily.generation_eos_ids`), the
tokenizer config's ``eos_token`` and the adapter's ``chat_stop_tokens``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from neuron_port.errors import TemplateError
from neuron_port.families import DecoderFamily
from neuron_port.generation.prompts import bos_prefix

CHAT_TEMPLATE_FILE = "chat_template.jinja"


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def tokenizer_config(directory: str | Path | None) -> dict[str, Any]:
    """``tokenizer_config.json`` of a model or artifact directory ({} when absent or unreadable)."""
    return {} if directory is None else _json_or_empty(Path(directory) / "tokenizer_config.json")


def generation_config(directory: str | Path | None) -> dict[str, Any]:
    """``generation_config.json`` of a model or artifact directory ({} when absent or unreadable)."""
    return {} if directory is None else _json_or_empty(Path(directory) / "generation_config.json")


def generation_eos_ids(directory: str | Path | None, family: DecoderFamily | None = None) -> tuple[int, ...]:
    """The end-of-sequence ids ``generation_config.json`` lists (() when absent), read by ``family``
    (default: the plain decoder adapter)."""
    from neuron_port.families.decoder import DecoderFamily as Plain

    return (family or Plain()).generation_eos_ids(generation_config(directory))


def chat_template(directory: str | Path | None) -> str | None:
    """The model's chat template: ``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template``."""
    if directory is None:
        return None
    path = Path(directory) / CHAT_TEMPLATE_FILE
    if path.is_file():
        return path.read_text()
    value = tokenizer_config(directory).get("chat_template")
    if isinstance(value, list):  # named templates: the default one
        value = next((t.get("template") for t in value if isinstance(t, dict) and t.get("name") == "default"), None)
    return value if isinstance(value, str) else None


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError as JinjaError

    raise JinjaError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' ``tojson``: plain JSON, no HTML escaping."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compiled(template: str):
    """The template compiled once, in the environment transformers renders chat templates in."""
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}`` (assistant-token tracking in transformers): the body as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller) -> str:
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_template(template: str, messages: list[dict[str, Any]], special_tokens: dict[str, str],
                    add_generation_prompt: bool = True) -> str:
    """``template`` rendered over ``messages`` as transformers' ``apply_chat_template`` renders it
    (no tools, no documents)."""
    from jinja2 import TemplateError as JinjaError

    try:
        return _compiled(template).render(messages=messages, tools=None, documents=None,
                                          add_generation_prompt=add_generation_prompt, **special_tokens)
    except (JinjaError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise TemplateError(f"the model's chat template failed: {exc}") from None


@dataclass(frozen=True)
class ChatFormat:
    """How chat messages become prompt ids, and which tokens end the assistant's turn."""

    family: DecoderFamily
    template: str | None
    stop_ids: tuple[int, ...]
    special_tokens: dict[str, str] = field(default_factory=dict)

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text up to the assistant's turn. A template writes the special tokens it
        wants (BOS included); the family's own format leaves BOS out (see :meth:`encode`)."""
        if self.template:
            return render_template(self.template, messages, self.special_tokens)
        text = self.family.chat_prompt(messages)
        if text is None:
            raise ValueError(f"this model has no chat template (no chat_template.jinja or chat_template in "
                             f"tokenizer_config.json, and no default format for the {self.family.name} family): "
                             "use /v1/completions")
        return text

    def encode(self, messages: list[dict[str, Any]], tokenizer: Any, bos_id: int | None) -> list[int]:
        """Prompt ids: a template's text tokenized with no special tokens added (transformers'
        ``apply_chat_template(tokenize=True)``); the family's format (which leaves BOS out) with
        the tokenizer's special tokens, and ``bos_id`` first if the tokenizer adds none
        (:func:`neuron_port.generation.prompts.bos_prefix`)."""
        return self.encode_text(self.render(messages), tokenizer, bos_id)

    def encode_text(self, text: str, tokenizer: Any, bos_id: int | None) -> list[int]:
        """:meth:`encode` of text :meth:`render` already gave."""
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: chat needs one")
        if self.template:
            return tokenizer.encode(text, add_special_tokens=False).ids
        return bos_prefix(tokenizer, bos_id) + tokenizer.encode(text).ids


def special_tokens(directory: str | Path | None) -> dict[str, str]:
    """The tokenizer's named special tokens (``bos_token``, ``eos_token``, ...; what a template sees
    as variables): ``special_tokens_map.json`` overlaid by ``tokenizer_config.json``."""
    if directory is None:
        return {}
    merged = {**_json_or_empty(Path(directory) / "special_tokens_map.json"), **tokenizer_config(directory)}
    return {key: text for key, value in merged.items() if key.endswith("_token") and (text := _token_text(value))}


def chat_format(family: DecoderFamily, tokenizer: Any, directory: str | Path | None) -> ChatFormat:
    """The chat format of a model: its files first (template, special tokens, generation config),
    its family adapter second."""
    specials = special_tokens(directory)
    names = [t for t in (specials.get("eos_token"), *family.chat_stop_tokens) if t]
    ids = [tokenizer.token_to_id(name) for name in names] if tokenizer is not None else []
    stops = (*generation_eos_ids(directory, family), *(i for i in ids if i is not None))
    return ChatFormat(family, chat_template(directory), tuple(dict.fromkeys(stops)), specials)


__all__ = [
    "CHAT_TEMPLATE_FILE",
    "special_tokens",
    "tokenizer_config",
    "generation_config",
    "generation_eos_ids",
    "chat_template",
    "render_template",
    "ChatFormat",
    "chat_format",
]
