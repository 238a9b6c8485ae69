"""Reading an artifact back: its ranks, each rank's port, and the CPU reference it was built from.

An artifact is read the way a server reads it: the manifest verified once
(:func:`neuron_port.artifact.verify`), then each rank assembles a
:class:`~neuron_port.port.Port` from its compiled graphs and the host embeddings — no model,
no Hugging Face forward. The rank's KV layout is checked against what the manifest recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from neuron_port.artifact import ArtifactError, host_ranks, weights_fingerprint
from neuron_port.backends import get_backend
from neuron_port.configs import load_config
from neuron_port.embedding import load_host_embeddings
from neuron_port.layout import describe
from neuron_port.models import checkpoint_state
from neuron_port.port import Port
from neuron_port.ranks import Rank, RankSetup
from neuron_port.runners import load_runners
from neuron_port.shapes import PortShape


def artifact_setup(directory: str | Path, manifest: dict[str, Any]) -> RankSetup:
    """The host ranks of an artifact: the layout of its config and the shard plan at its tp (at 1
    for nxd, whose one executor runs every core: :func:`neuron_port.artifact.host_ranks`)."""
    return RankSetup.for_layout(describe(load_config(Path(directory) / "config.json")), host_ranks(manifest))


def artifact_shape(manifest: dict[str, Any]) -> PortShape:
    """The prompt buckets and KV lengths the artifact's graphs were compiled for."""
    return PortShape(manifest["buckets"], manifest["kv_lens"], manifest.get("ring_buffers", True))


def load_rank_port(directory: str | Path, manifest: dict[str, Any], rank: Rank) -> Port:
    """Rank ``rank``'s port from a verified artifact: its compiled graphs and the host embeddings."""
    directory = Path(directory)
    config = load_config(directory / "config.json")
    stores = artifact_shape(manifest).stores(rank.layout, rank.local_kv_heads)
    expected = manifest["kv_layout"][rank.rank]
    if stores.kv_layout() != expected:
        raise ArtifactError(f"field kv_layout (rank {rank.rank}): expected {expected}, found {stores.kv_layout()} "
                            "for this config and tp")
    embeddings = load_host_embeddings(directory, config)
    runners = load_runners(get_backend(manifest["backend"]), directory / f"rank{rank.rank}", stores.buckets,
                           stores.kv_lens, int(manifest["batch"]), manifest.get("runners", {}), {"word": embeddings.word})
    return Port.from_runners(rank.layout, stores, embeddings, runners)


def reference_model(manifest: dict[str, Any]) -> nn.Module:
    """Rebuild the float32 CPU reference from the artifact's recorded source (a directory through
    Hugging Face's own ``from_pretrained``, never this library's loader), proven to be the same
    weights: its state cast to the artifact's dtype has the manifest's weights fingerprint."""
    from neuron_port.models import cast_state, parse_dtype
    from neuron_port.reference import reference_for_source

    source = manifest["source"]
    if source.get("kind") == "shipped":
        model = reference_for_source(source["name"], tiny=bool(source.get("tiny")), seed=int(source.get("seed", 0)))
    elif source.get("kind") == "dir":
        if not Path(source["path"]).is_dir():
            raise ArtifactError(f"the reference checkpoint {source['path']} recorded in the manifest is not available here")
        model = reference_for_source(source["path"])
    else:
        raise ArtifactError(f"field source: expected kind 'shipped' or 'dir', found {source!r}")
    dtype = parse_dtype(manifest.get("dtype", "float32"))
    found = weights_fingerprint(cast_state(checkpoint_state(model, clone=False), dtype))
    if found != manifest["weights_fingerprint"]:
        raise ArtifactError(
            f"the CPU reference rebuilt from {source} is not the artifact's checkpoint: weights fingerprint "
            f"expected {manifest['weights_fingerprint']}, found {found}; refusing to compare against the wrong oracle"
        )
    return model


__all__ = ["artifact_setup", "artifact_shape", "load_rank_port", "reference_model"]
