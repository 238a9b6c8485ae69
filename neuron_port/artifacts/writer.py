"""Writing an artifact: the host files, every rank's compiled graphs, the manifest.

:func:`write_artifact` is the whole job, in the order a reader can follow: the host files (config,
embedding tables, tokenizer) first, then :func:`compile_rank` on every rank of the given
:class:`~neuron_port.parallel.ranks.RankSetup` (gloo processes for tp > 1, so the traced graphs
carry the all-reduce as an op), then the manifest. The nxd backend instead traces every rank's
graphs with one ModelBuilder in this process
(:func:`~neuron_port.backends.nxd_artifact.write_nxd_rank`). Each rank builds its port over its
shard (:meth:`Port.for_rank`), compiles it with the same loop ``Port.compile`` uses, and saves its
weights and graphs. The directory is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import nn

from neuron_port.artifacts.manifest import (
    ArtifactError,
    atomic_directory,
    config_hash,
    installed_versions,
    weights_fingerprint,
    write_manifest,
)
from neuron_port.artifacts.record import Manifest
from neuron_port.backends import check_backend_tp, get_backend, require_backend
from neuron_port.backends.nxd_artifact import write_nxd_rank
from neuron_port.backends.registry import artifact_backends, backend_spec
from neuron_port.backends.weight_pool import HOST_PREFIX
from neuron_port.families import DecoderFamily, adapter_source
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.port import Port
from neuron_port.graph.runners import save_runners
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import config_to_dict
from neuron_port.model.loading import checkpoint_state
from neuron_port.model.localdir import write_tokenizer
from neuron_port.model.source import Source
from neuron_port.parallel.ranks import Rank, RankSetup, check_setup_matches, run_ranks

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
"""The model's files an artifact carries beside its graphs: tokenizer, special tokens, chat template, eos ids."""


def compile_rank(out_dir: str, shape: PortShape, backend_name: str, batch: int, rank: Rank) -> dict[str, Any]:
    """Build rank ``rank``'s graphs, compile them and save them into ``out_dir/rank{r}``, with
    one copy of its weights for all of them. Returns what the manifest records of the rank: its KV layout and the
    facts of its runners."""
    backend = get_backend(backend_name)
    port = Port.for_rank(rank, shape)
    port.compile(backend, batch, desc=f"compiling rank{rank.rank}")
    rank_dir = Path(out_dir) / f"rank{rank.rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    # The rank's weights, once for all its graphs; a tied head reads the host's word table (not stored twice).
    named = {
        **checkpoint_state(rank.model, clone=False),
        HOST_PREFIX + "word": rank.layout.family.word_embedding(rank.model).weight.detach(),
    }
    save_runners(port.runners, backend, rank_dir, named)
    return {"kv_layout": port.stores.kv_layout(), "runners": port.runners.facts()}


def write_host_files(
    out: Path, model: nn.Module, family: DecoderFamily, source: Source, tokenizer_dir: str | Path | None
) -> tuple[dict[str, Any], HostEmbeddings]:
    """config.json, embeddings.safetensors and the tokenizer files; returns the config dict and
    the host embeddings written (``family``: the model's adapter, resolved by the caller)."""
    config = family.text_config_of(model)
    config_dict = config_to_dict(config)
    (out / "config.json").write_text(json.dumps(config_dict, indent=2))
    emb = HostEmbeddings.from_model(model)
    tables = {family.word_embedding_key(): emb.word.contiguous()}
    if emb.ple is not None:
        tables[family.per_layer_embedding_key()] = emb.ple.contiguous()
    save_file(tables, str(out / "embeddings.safetensors"))
    present = [Path(tokenizer_dir) / f for f in TOKENIZER_FILES] if tokenizer_dir is not None else []
    if any(p.name == "tokenizer.json" and p.exists() for p in present):
        for path in present:
            if path.exists():
                shutil.copy(path, out / path.name)
    elif source.tiny:
        write_tokenizer(out, family.vocab_size(config))  # the demo tokenizer of the tiny variants
    return config_dict, emb


def write_artifact(
    out_dir: str | Path,
    model: nn.Module,
    source: Source,
    setup: RankSetup,
    shape: PortShape,
    backend: str = "cpu",
    batch: int = 1,
    tokenizer_dir: str | Path | None = None,
) -> Manifest:
    """Write a verified artifact of ``model`` sharded by ``setup`` and shaped by ``shape``; returns its manifest.

    ``source`` says where the weights came from (a shipped config and seed, or a directory, with
    ``quant``: the scheme of ``model``'s projections) so a later check can rebuild the same CPU reference
    and prove it is the same checkpoint (weights fingerprint). ``model`` is not modified.
    """
    if backend not in artifact_backends():
        raise ArtifactError(
            f"backend {backend!r} does not save graphs; an artifact takes cpu, neuron or nxd "
            "(xla graphs are checked in process with 'neuron-port port --backend xla')"
        )
    check_backend_tp(backend, setup.tp)
    require_backend(backend)  # fail fast (missing SDK) before any work
    get_backend(backend)
    check_setup_matches(setup, model)
    with atomic_directory(out_dir) as tmp:
        config_dict, embeddings = write_host_files(tmp, model, setup.layout.family, source, tokenizer_dir)
        if backend_spec(backend).whole_artifact:  # one ModelBuilder traces every core's graphs from this process
            ranks = [write_nxd_rank(tmp / "rank0", model, setup, shape, batch)]
        else:
            ranks = run_ranks(functools.partial(compile_rank, str(tmp), shape, backend, batch), setup, model, mode="gloo")
        manifest = write_manifest(
            tmp,
            {
                "backend": backend,
                "versions": installed_versions(),
                "model_type": config_dict["model_type"],
                "adapter": adapter_source(setup.layout.family).to_json(),
                "config_hash": config_hash(config_dict),
                "weights_fingerprint": weights_fingerprint(checkpoint_state(model, clone=False)),
                "source": source.to_json(),
                **shape.to_json(),
                "tp": setup.tp,
                "batch": batch,
                "dtype": str(embeddings.word.dtype),
                "kv_layout": [r["kv_layout"] for r in ranks],
                "runners": ranks[0]["runners"],
            },
        )
    return Manifest.from_json(manifest)


__all__ = ["TOKENIZER_FILES", "compile_rank", "write_host_files", "write_artifact"]
