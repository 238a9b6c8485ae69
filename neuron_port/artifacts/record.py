"""An artifact's manifest as one typed record, read and verified once.

:func:`~neuron_port.artifacts.manifest.verify` checks the JSON (format, field digests, versions, adapter,
every file's hash, the config's hash) and returns a :class:`Manifest`; everything past the artifacts layer
reads its fields, never the JSON's keys. It pickles, so a tp > 1 server hands it to its rank processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_port.backends.registry import backend_spec
from neuron_port.errors import ArtifactError, ModelSourceError
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import parse_dtype
from neuron_port.model.source import Source


@dataclass(frozen=True)
class Manifest:
    """What an artifact is: its ``backend``, tp degree, the ``batch`` its graphs take, the ``dtype`` of its
    weights, the ``shape`` it was built for (prompt buckets, KV lengths), where its weights came from
    (``source``) and their fingerprint, the model type and config hash, the versions and adapter that
    built it, each rank's KV layout, the runners' recorded facts (``runners``: the KV-write kind, the row
    graphs, a resident store) and every file's SHA-256 (``files``: relative path -> digest)."""

    backend: str
    tp: int
    batch: int
    dtype: torch.dtype
    shape: PortShape
    source: Source
    model_type: str
    weights_fingerprint: str
    config_hash: str
    versions: Mapping[str, str | None] = field(default_factory=dict)
    adapter: Mapping[str, Any] | None = None
    kv_layout: tuple[Any, ...] = ()
    runners: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def host_ranks(self) -> int:
        """The host processes the artifact runs in: one per rank, except nxd (and neuron), whose one executor
        drives every NeuronCore from one process."""
        return 1 if backend_spec(self.backend).whole_artifact else self.tp

    def summary(self) -> dict[str, Any]:
        """The JSON a command prints about it (its files counted, its dtype spelled as torch does; ``draft_tokens``
        where it holds verify graphs)."""
        out = {"backend": self.backend, "tp": self.tp, "buckets": list(self.shape.buckets),
               "kv_lens": list(self.shape.kv_lens), "batch": self.batch, "dtype": str(self.dtype),
               "weights_fingerprint": self.weights_fingerprint, "quant": self.source.quant, "files": len(self.files)}
        return {**out, "draft_tokens": self.shape.draft_tokens} if self.shape.draft_tokens else out

    @classmethod
    def from_json(cls, record: Mapping[str, Any], where: str = "manifest.json") -> Manifest:
        """The typed record of a manifest's JSON (its integrity is :func:`verify`'s to check); a field
        missing or of the wrong kind is an :class:`~neuron_port.errors.ArtifactError` naming it."""
        try:
            return cls(
                backend=str(record["backend"]),
                tp=int(record["tp"]),
                batch=int(record["batch"]),
                dtype=parse_dtype(record["dtype"]),
                shape=PortShape(record["buckets"], record["kv_lens"], bool(record.get("ring_buffers", True)),
                                int(record.get("draft_tokens", 0))),
                source=Source.from_json(record["source"]),
                model_type=str(record["model_type"]),
                weights_fingerprint=str(record["weights_fingerprint"]),
                config_hash=str(record["config_hash"]),
                versions=dict(record.get("versions") or {}),
                adapter=dict(record["adapter"]) if record.get("adapter") else None,
                kv_layout=tuple(record.get("kv_layout") or ()),
                runners=dict(record.get("runners") or {}),
                files=dict(record.get("files") or {}),
            )
        except KeyError as exc:
            raise ArtifactError(f"{where}: field {exc.args[0]!r} is missing") from None
        except (ModelSourceError, ValueError, TypeError) as exc:
            raise ArtifactError(f"{where}: {exc}") from None


__all__ = ["Manifest"]
