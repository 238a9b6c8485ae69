"""Where a model's weights came from: a shipped config (built from a seed) or a checkpoint directory.

An artifact records its :class:`Source` in the manifest, so a later check can rebuild the same CPU
reference and prove, by the weights fingerprint, that it is the same checkpoint. In a process it is this
record; across one it is the JSON of :meth:`Source.to_json` (the manifest's ``source`` field).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_port.errors import ModelSourceError

KINDS = ("shipped", "dir")


@dataclass(frozen=True)
class Source:
    """``kind`` ``"shipped"``: a shipped config by ``name`` (its tiny variant with ``tiny``), weights drawn
    from ``seed``; ``"dir"``: a checkpoint directory at ``path`` (absolute). ``quant``: the scheme of the
    model's projections (:data:`~neuron_port.model.quant.QUANT_SCHEMES`)."""

    kind: str
    name: str | None = None
    path: str | None = None
    tiny: bool = False
    seed: int = 0
    quant: str = "none"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ModelSourceError(f"a source's kind is one of {KINDS}, found {self.kind!r}")
        if (self.kind == "shipped") != (self.name is not None) or (self.kind == "dir") != (self.path is not None):
            raise ModelSourceError(f"a shipped source names a config and a dir source a path, found kind {self.kind!r} "
                             f"with name {self.name!r} and path {self.path!r}")

    @classmethod
    def shipped(cls, name: str, tiny: bool = False, seed: int = 0, quant: str = "none") -> Source:
        return cls("shipped", name=name, tiny=bool(tiny), seed=int(seed), quant=quant)

    @classmethod
    def directory(cls, path: str, quant: str = "none") -> Source:
        return cls("dir", path=str(path), quant=quant)

    @property
    def is_checkpoint(self) -> bool:
        """Real weights read from a directory (not drawn from a seed)."""
        return self.kind == "dir"

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``source`` field: ``{"kind": "shipped", "name", "tiny", "seed", "quant"}`` or
        ``{"kind": "dir", "path", "quant"}``."""
        if self.kind == "shipped":
            return {"kind": "shipped", "name": self.name, "tiny": self.tiny, "seed": self.seed, "quant": self.quant}
        return {"kind": "dir", "path": self.path, "quant": self.quant}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Source:
        """The record :meth:`to_json` wrote; a clear error naming what is missing or unknown."""
        kind = record.get("kind") if isinstance(record, Mapping) else None
        if kind == "shipped" and "name" in record:
            return cls.shipped(record["name"], bool(record.get("tiny", False)), int(record.get("seed", 0)),
                               record.get("quant", "none"))
        if kind == "dir" and "path" in record:
            return cls.directory(record["path"], record.get("quant", "none"))
        raise ModelSourceError(f"field source: expected {{'kind': 'shipped', 'name': ...}} or {{'kind': 'dir', 'path': ...}}, "
                         f"found {record!r}")


__all__ = ["Source", "KINDS"]
