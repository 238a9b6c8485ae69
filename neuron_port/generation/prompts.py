"""Prompts as token ids: seeded random ones for random-weight checks, or text through a tokenizer.

A random prompt puts the family's BOS first when it has one (the config's id, never a literal). A
text prompt is the model's tokenizer's own encoding, special tokens as its ``tokenizer.json``
adds them: transformers' rule, so the port and Hugging Face always see the same ids (SmolLM2's
tokenizer adds no BOS, Gemma's adds one) and never two BOS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from neuron_port.errors import PromptError
from neuron_port.model.tokenizer import load_tokenizer

RANDOM_PROMPT_SEED_OFFSET = 1000
FIRST_ORDINARY_ID = 3  # ids below are the demo tokenizer's pad, eos and bos


def bos_prefix(tokenizer: Any, bos_id: int | None) -> list[int]:
    """``[bos_id]`` unless there is none or the tokenizer already starts every encoding with it."""
    if bos_id is None:
        return []
    probe = tokenizer.encode("a").ids if tokenizer is not None else []
    return [] if probe[:1] == [bos_id] else [bos_id]


def random_prompt(vocab_size: int, length: int, seed: int = 0, bos: int | None = None) -> list[int]:
    """``length`` seeded random ids (from the generator seeded ``seed + 1000``); BOS first when given."""
    if length < 1:
        raise PromptError(f"a prompt needs at least one token, found length {length}")
    gen = torch.Generator().manual_seed(seed + RANDOM_PROMPT_SEED_OFFSET)
    ids = torch.randint(FIRST_ORDINARY_ID, vocab_size, (length,), generator=gen).tolist()
    if bos is not None:
        ids[0] = bos
    return ids


def text_prompt(tokenizer_dir: str | Path, text: str) -> list[int]:
    """``text`` tokenised with ``tokenizer_dir``'s tokenizer.json, special tokens as it adds them
    (what ``AutoTokenizer.from_pretrained(tokenizer_dir)(text).input_ids`` gives)."""
    tok = load_tokenizer(tokenizer_dir)
    if tok is None:
        raise PromptError(f"a text prompt needs a tokenizer.json in {tokenizer_dir}; it has none. "
                          "Use --prompt-len N for random prompt tokens.")
    return tok.encode(text).ids


def staggered_prompts(prompt: list[int], batch: int, step: int = 3) -> list[list[int]]:
    """``batch`` rows from one prompt, each ``step`` tokens shorter than the one before (at least one
    token): a batch whose rows all have their own length, so a check covers every row's position."""
    return [prompt[: max(1, len(prompt) - step * row)] for row in range(batch)]


__all__ = ["staggered_prompts", "bos_prefix", "random_prompt", "text_prompt"]
