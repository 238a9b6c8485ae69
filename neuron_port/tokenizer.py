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


__all__ = ["load_tokenizer"]
