"""One opened model: what a command knows about a model before it builds anything, read once.

A shipped name, a ``config.json``, a model directory or a compiled artifact (a hub id is resolved to
its snapshot directory first, :func:`neuron_port.model.hub.resolve_model`) opens to an
:class:`OpenedModel`: its text config, family adapter and special ids; its tokenizer, chat format and
stop ids, read from its files when first asked for and kept. The commands, the server's loader, the
doctor, the recipes and :class:`~neuron_port.auto.PortedModel` take this value instead of each
reading ``config.json``, looking up the family and walking the tokenizer files again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from neuron_port.errors import PromptError
from neuron_port.families import DecoderFamily, family_for
from neuron_port.families.parts import SpecialIds
from neuron_port.generation.chat import ChatFormat, chat_format, generation_eos_ids
from neuron_port.generation.prompts import random_prompt
from neuron_port.model.configs import load_config
from neuron_port.model.tokenizer import decode_tokens, load_tokenizer


@dataclass(frozen=True)
class OpenedModel:
    """A model's facts, read once.

    ``source``: the shipped name, ``config.json`` or directory it was opened from; ``directory``: the
    model or artifact directory whose files (tokenizer, chat template, generation config) it reads,
    None for a shipped name or a config file; ``artifact``: the directory is a compiled artifact;
    ``config``: the text config (the tiny variant with ``tiny``)."""

    source: str
    directory: Path | None
    artifact: bool
    tiny: bool
    config: Any = field(repr=False)
    family: DecoderFamily = field(repr=False)

    @classmethod
    def open(cls, source: str | Path, tiny: bool = False) -> OpenedModel:
        """Open a shipped name, a ``config.json``, a model directory or an artifact directory."""
        path = Path(source)
        directory = path if path.is_dir() else None
        artifact = directory is not None and (directory / "manifest.json").exists()
        config = load_config(str(source), tiny=tiny and not artifact)
        return cls(str(source), directory, artifact, tiny, config, family_for(config.model_type))

    @property
    def real_weights(self) -> bool:
        """Whether the weights come from a checkpoint (a directory), not a seeded random init."""
        return self.directory is not None

    @cached_property
    def special(self) -> SpecialIds:
        return self.family.special_ids(self.config)

    @property
    def vocab_size(self) -> int:
        return self.family.vocab_size(self.config)

    @cached_property
    def tokenizer(self) -> Any:
        """The directory's ``tokenizer.json`` (None without one, or without a directory)."""
        return load_tokenizer(self.directory) if self.directory is not None else None

    @cached_property
    def chat(self) -> ChatFormat:
        """The chat format: the directory's template and special tokens first, the family's second."""
        return chat_format(self.family, self.tokenizer, self.directory)

    @cached_property
    def eos_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id, the config's and then ``generation_config.json``'s, whatever a run's
        stop policy."""
        return tuple(dict.fromkeys((*self.special.eos, *generation_eos_ids(self.directory, self.family))))

    def stop_ids(self, chat: bool = False, eos_means_end: bool | None = None, stop_at_eos: bool | None = None) -> list[int]:
        """The ids a generation stops at: the end-of-sequence ids, and with ``chat`` the chat format's
        turn-ending ids, where the end-of-sequence token means the end (``eos_means_end``; default: real
        weights; a random model's EOS is noise); none otherwise. ``stop_at_eos`` (``--stop-at-eos`` /
        ``--ignore-eos``) decides instead when given."""
        means_end = self.real_weights if eos_means_end is None else eos_means_end
        if not (means_end if stop_at_eos is None else stop_at_eos):
            return []
        ids = [*self.eos_ids, *(self.chat.stop_ids if chat and self.directory is not None else ())]
        return list(dict.fromkeys(ids))

    # ---- prompts and text ------------------------------------------------------------------------------
    def _needs_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise PromptError(f"{what} needs a tokenizer.json in {self.directory or self.source}; it has none. "
                              "Use --prompt-len N for random prompt tokens.")
        return self.tokenizer

    def text_prompt(self, text: str) -> list[int]:
        """``text`` tokenised with the model's tokenizer, special tokens as it adds them (what
        ``AutoTokenizer.from_pretrained(directory)(text).input_ids`` gives)."""
        return self._needs_tokenizer("a text prompt").encode(text).ids

    def chat_prompt(self, message: str) -> list[int]:
        """One user ``message`` through the model's chat format."""
        return self.chat.encode([{"role": "user", "content": message}], self._needs_tokenizer("a chat prompt"),
                                self.special.bos)

    def random_prompt(self, length: int, seed: int = 0) -> list[int]:
        """``length`` seeded random ids, BOS first when the family has one."""
        return random_prompt(self.vocab_size, length, seed, self.special.bos)

    def decode(self, tokens: list[int], stop_ids: list[int] = ()) -> str | None:
        """Generated ``tokens`` as text, special tokens left out as transformers'
        ``decode(skip_special_tokens=True)`` leaves them (and a final stop token); None without a tokenizer."""
        return None if self.tokenizer is None else decode_tokens(self.tokenizer, tokens, stop_ids)


__all__ = ["OpenedModel"]
