"""Reading an artifact back: its ranks and each rank's port.

An artifact is read the way a server reads it: the manifest verified once
(:func:`neuron_port.artifacts.manifest.verify`), then each rank assembles a
:class:`~neuron_port.graph.port.Port` from its compiled graphs and the host embeddings — no model,
no Hugging Face forward. The rank's KV layout is checked against what the manifest recorded.
"""

from __future__ import annotations

from pathlib import Path

from neuron_port.artifacts.record import Manifest
from neuron_port.backends import get_backend
from neuron_port.errors import ArtifactError
from neuron_port.graph.embedding import load_host_embeddings
from neuron_port.graph.port import Port
from neuron_port.graph.runners import load_runners
from neuron_port.model.configs import load_config
from neuron_port.model.layout import describe
from neuron_port.parallel.launch import Reduce, identity_reduce
from neuron_port.parallel.ranks import Rank, RankSetup, make_rank


def artifact_setup(directory: str | Path, manifest: Manifest) -> RankSetup:
    """The host ranks of an artifact: the layout of its config and the shard plan at its tp (at 1
    for nxd, whose one executor runs every core: :attr:`Manifest.host_ranks`)."""
    return RankSetup.for_layout(describe(load_config(Path(directory) / "config.json")), manifest.host_ranks)


def load_rank_port(directory: str | Path, manifest: Manifest, rank: Rank | int,
                   reduce: Reduce = identity_reduce) -> Port:
    """Rank ``rank``'s port from a verified artifact: its compiled graphs and the host embeddings;
    the one way every reader (``generate``, the server, its lockstep ranks) gets one.

    ``rank``: a :class:`Rank` already set up (``run_ranks`` gives each rank its own), or its index,
    set up here over the artifact's ranks with ``reduce`` (what its graphs all-reduce with)."""
    if isinstance(rank, int):
        rank = make_rank(artifact_setup(directory, manifest), rank, reduce, None)
    directory = Path(directory)
    config = load_config(directory / "config.json")
    stores = manifest.shape.stores(rank.layout, rank.local_kv_heads)
    expected = manifest.kv_layout[rank.rank]
    if stores.kv_layout() != expected:
        raise ArtifactError(f"field kv_layout (rank {rank.rank}): expected {expected}, found {stores.kv_layout()} "
                            "for this config and tp")
    embeddings = load_host_embeddings(directory, config)
    runners = load_runners(get_backend(manifest.backend), directory / f"rank{rank.rank}", stores.buckets,
                           stores.kv_lens, manifest.batch, manifest.runners, {"word": embeddings.word})
    return Port.from_runners(rank.layout, stores, embeddings, runners)


__all__ = ["artifact_setup", "load_rank_port"]
