"""Deprecated facade (kept for one release): the artifact functions of earlier versions.

Use instead:

* :func:`neuron_port.artifact_writer.write_artifact` (with a :class:`~neuron_port.ranks.RankSetup`
  and a :class:`~neuron_port.shapes.PortShape`) for ``compile_artifact``;
* :func:`neuron_port.generation.generate` for ``generate_from_artifact``;
* :func:`neuron_port.artifact_reader.load_rank_port` for ``load_port``;
* :func:`neuron_port.validation.check_in_fresh_process` (same name, now there).

Each function here is a thin wrapper with the old signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from torch import nn

from neuron_port.artifact import verify
from neuron_port.artifact_reader import artifact_setup, load_rank_port, reference_model
from neuron_port.artifact_writer import write_artifact
from neuron_port.generation import generate
from neuron_port.layout import describe
from neuron_port.parallel import identity_reduce
from neuron_port.port import Port
from neuron_port.ranks import RankSetup, make_rank
from neuron_port.shapes import PortShape
from neuron_port.validation import check_in_fresh_process


def compile_artifact(
    model: nn.Module,
    out_dir: str | Path,
    source: dict[str, Any],
    buckets: Sequence[int] = (32, 64, 128),
    kv_lens: Sequence[int] = (256,),
    tp: int = 1,
    backend: str = "cpu",
    batch: int = 1,
    tokenizer_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Write a verified artifact for ``model``; returns its manifest (see :func:`write_artifact`)."""
    setup = RankSetup.for_layout(describe(model), tp)
    return write_artifact(out_dir, model, source, setup, PortShape(buckets, kv_lens), backend, batch, tokenizer_dir)


def load_port(directory: str | Path, rank: int = 0, allow_version_mismatch: bool = False, manifest: dict | None = None) -> Port:
    """Verify an artifact and assemble rank ``rank``'s port from its compiled graphs."""
    manifest = manifest or verify(directory, allow_version_mismatch)
    return load_rank_port(directory, manifest, make_rank(artifact_setup(directory, manifest), rank, identity_reduce, None))


def generate_from_artifact(directory: str | Path, prompts: list[list[int]], max_new_tokens: int,
                           stop_ids: Sequence[int] = (), allow_version_mismatch: bool = False,
                           manifest: dict | None = None) -> dict[str, Any]:
    """Greedy generation from an artifact directory alone; rank 0's result as JSON-able data."""
    manifest = manifest or verify(directory, allow_version_mismatch)
    return generate(directory, prompts, max_new_tokens, stop_ids=stop_ids, manifest=manifest).to_json()


__all__ = ["compile_artifact", "load_port", "generate_from_artifact", "reference_model", "check_in_fresh_process"]
