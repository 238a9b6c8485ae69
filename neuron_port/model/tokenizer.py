"""Tokenizer files next to a model: loaded with the ``tokenizers`` library, never from a hub."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


def load_tokenizer(model_dir: str | Path) -> Tokenizer | None:
    """The ``tokenizer.json`` of a model directory, or None when there is none."""
    path = Path(model_dir)
    path = path / "tokenizer.json" if path.is_dir() else path.with_name("tokenizer.json")
    if not path.exists():
        return None
    return Tokenizer.from_file(str(path))


def decode_completion(model_dir: str | Path, tokens: list[int], stop_ids: list[int] = ()) -> str | None:
    """Generated ``tokens`` as text through ``model_dir``'s tokenizer.json, special tokens left out
    as transformers' ``decode(..., skip_special_tokens=True)`` leaves them (and a final stop token
    that is not special); None when the directory has no tokenizer."""
    tok = load_tokenizer(model_dir)
    return None if tok is None else decode_tokens(tok, tokens, stop_ids)


def decode_tokens(tokenizer: Tokenizer, tokens: list[int], stop_ids: list[int] = ()) -> str:
    """:func:`decode_completion` through a tokenizer already loaded."""
    shown = tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens
    return tokenizer.decode(list(shown), skip_special_tokens=True)


__all__ = ["load_tokenizer", "decode_completion", "decode_tokens"]
