"""Compile a model into a verified artifact, and run an artifact from its directory alone.

``compile_artifact`` builds each rank's port (gloo processes for TP, with the all-reduce traced
as a custom op), compiles every graph with the backend, and writes the artifact atomically.
``load_port`` verifies an artifact and assembles a :class:`~neuron_port.port.Port` from its
compiled graphs and host embeddings — no model, no Hugging Face forward, exactly the path a
server takes. ``generate_from_artifact`` runs it, across gloo ranks when the artifact is TP.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from neuron_port.artifact import (
    ArtifactError,
    atomic_directory,
    config_hash,
    installed_versions,
    verify,
    weights_fingerprint,
    write_manifest,
)
from neuron_port.backends import get_backend
from neuron_port.configs import config_to_dict
from neuron_port.embedding import HostEmbeddings, load_host_embeddings
from neuron_port.families import family_of
from neuron_port.layout import Layout, describe
from neuron_port.models import checkpoint_state
from neuron_port.port import Port


def _kv_layout(port: Port) -> dict[str, list[dict[str, Any]]]:
    return {
        str(kv): [
            {"layer": s.layer, "attention": s.attention, "n_kv": s.n_kv, "head_dim": s.head_dim, "slots": s.slots, "ring": s.ring}
            for s in spec.slots
        ]
        for kv, spec in port.specs.items()
    }


def _build_rank(model: nn.Module, layout: Layout, rank_dir: Path, buckets, kv_lens, backend_name: str, kv_heads=None,
                batch: int = 1) -> dict:
    """Compile one rank's graphs into ``rank_dir``; returns its KV layout."""
    backend = get_backend(backend_name)
    port = Port(model, layout, buckets, kv_lens, kv_heads=kv_heads)
    rank_dir.mkdir(parents=True, exist_ok=True)
    state = checkpoint_state(model)
    save_file(state, str(rank_dir / "weights.safetensors"))
    jobs = [("prefill", b, g, port.example_inputs_prefill(b, batch)) for b, g in port.prefill_graphs.items()]
    jobs += [("decode", kv, g, port.example_inputs_decode(kv, batch)) for kv, g in port.decode_graphs.items()]
    for kind, size, graph, example in tqdm(jobs, desc=f"compiling {rank_dir.name}", unit="graph", leave=False):
        runnable = backend.compile(graph, example, graph.aliases)
        backend.save(runnable, rank_dir / f"{kind}_{size}.pt")
    return _kv_layout(port)


def _build_tp_rank(model_dir: str, out_dir: str, buckets, kv_lens, backend_name: str, tp: int, batch: int, rank: int, reduce) -> dict:
    from neuron_port.collectives import process_group_reduce
    from neuron_port.models import load_model_dir
    from neuron_port.shard_model import shard_model
    from neuron_port.sharding import plan_model

    model = load_model_dir(model_dir)
    layout = describe(model)
    plan = plan_model(layout, tp)
    shard = shard_model(model, layout, rank, tp, process_group_reduce, plan, inplace=True)
    return _build_rank(shard, layout, Path(out_dir) / f"rank{rank}", buckets, kv_lens, backend_name, plan.local_kv_heads(rank), batch)


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
    """Write a verified artifact for ``model``; returns its manifest.

    ``source`` says where the weights came from (``{"kind": "shipped", "name", "tiny", "seed"}``
    or ``{"kind": "dir", "path"}``) so a later check can rebuild the same CPU reference and
    prove it is the same checkpoint (weights fingerprint).
    """
    from neuron_port.models import save_model_dir
    from neuron_port.parallel import run_gloo
    from neuron_port.sharding import plan_model

    if backend == "nxd":
        from neuron_port.backends import require_backend

        require_backend("nxd")  # without the SDK: the install hint
        raise ArtifactError(
            "backend 'nxd': the ModelBuilder path (neuron_port.backends.nxd.build) is not wired into compile_artifact "
            "yet; build with it directly on an Inferentia2 host"
        )
    get_backend(backend)  # fail fast (missing SDK) before any work
    family = family_of(model)
    config = family.text_config_of(model)
    layout = describe(model)
    if tp > 1:
        plan_model(layout, tp)
    with atomic_directory(out_dir) as tmp:
        config_dict = config_to_dict(config)
        (tmp / "config.json").write_text(json.dumps(config_dict, indent=2))
        emb = HostEmbeddings.from_model(model)
        tables = {family.word_embedding_key(): emb.word.contiguous()}
        if emb.ple is not None:
            tables[family.per_layer_embedding_key()] = emb.ple.contiguous()
        save_file(tables, str(tmp / "embeddings.safetensors"))
        if tokenizer_dir is not None and (Path(tokenizer_dir) / "tokenizer.json").exists():
            shutil.copy(Path(tokenizer_dir) / "tokenizer.json", tmp / "tokenizer.json")
        elif source.get("tiny"):
            from neuron_port.localdir import write_tokenizer

            write_tokenizer(tmp, layout.vocab_size)  # the demo tokenizer of the tiny variants
        if tp == 1:
            layouts = [_build_rank(copy.deepcopy(model), layout, tmp / "rank0", buckets, kv_lens, backend, batch=batch)]
        else:
            with tempfile.TemporaryDirectory(prefix="neuron_port_model_") as model_dir:
                save_model_dir(model, model_dir)
                layouts = run_gloo(functools.partial(_build_tp_rank, model_dir, str(tmp), list(buckets), list(kv_lens), backend, tp, batch), tp)
        manifest = write_manifest(
            tmp,
            {
                "backend": backend,
                "versions": installed_versions(),
                "model_type": config.model_type,
                "config_hash": config_hash(config_dict),
                "weights_fingerprint": weights_fingerprint(checkpoint_state(model, clone=False)),
                "source": source,
                "buckets": sorted(buckets),
                "kv_lens": sorted(kv_lens),
                "tp": tp,
                "batch": batch,
                "dtype": str(emb.word.dtype),
                "kv_layout": layouts,
            },
        )
    return manifest


def load_port(directory: str | Path, rank: int = 0, allow_version_mismatch: bool = False, manifest: dict | None = None) -> Port:
    """Verify an artifact and assemble rank ``rank``'s port from its compiled graphs."""
    from neuron_port.configs import load_config
    from neuron_port.sharding import plan_model

    directory = Path(directory)
    manifest = manifest or verify(directory, allow_version_mismatch)
    config = load_config(directory / "config.json")
    layout = describe(config)
    tp = int(manifest["tp"])
    kv_heads = plan_model(layout, tp).local_kv_heads(rank) if tp > 1 else None
    backend = get_backend(manifest["backend"])
    rank_dir = directory / f"rank{rank}"
    prefill = {b: backend.load(rank_dir / f"prefill_{b}.pt") for b in manifest["buckets"]}
    decode = {kv: backend.load(rank_dir / f"decode_{kv}.pt") for kv in manifest["kv_lens"]}
    port = Port(None, layout, manifest["buckets"], manifest["kv_lens"], kv_heads=kv_heads,
                embeddings=load_host_embeddings(directory, config), runners=(prefill, decode),
                batch=int(manifest["batch"]))
    expected = manifest["kv_layout"][rank]
    if _kv_layout(port) != expected:
        raise ArtifactError(f"field kv_layout (rank {rank}): expected {expected}, found {_kv_layout(port)} for this config and tp")
    return port


def _generate_rank(directory: str, prompts, max_new_tokens: int, stop_ids, manifest: dict, rank: int, reduce) -> dict:
    from neuron_port.port import greedy_generate

    port = load_port(directory, rank, manifest=manifest)
    return greedy_generate(port, prompts, max_new_tokens, stop_ids).to_json()


def generate_from_artifact(directory: str | Path, prompts: list[list[int]], max_new_tokens: int,
                           stop_ids: Sequence[int] = (), allow_version_mismatch: bool = False,
                           manifest: dict | None = None) -> dict[str, Any]:
    """Greedy generation from an artifact directory alone (gloo ranks when it is TP).

    ``manifest``: one already returned by :func:`artifact.verify` for this directory; otherwise
    the artifact is verified here. The ranks reuse it instead of hashing every file again.
    """
    from neuron_port.parallel import run_gloo

    manifest = manifest or verify(directory, allow_version_mismatch)
    if int(manifest["batch"]) != len(prompts):
        raise ArtifactError(f"field batch: the graphs were compiled for batch {manifest['batch']}, found {len(prompts)} prompts")
    fn = functools.partial(_generate_rank, str(directory), prompts, max_new_tokens, list(stop_ids), manifest)
    if int(manifest["tp"]) == 1:
        return fn(0, None)
    return run_gloo(fn, int(manifest["tp"]))[0]


def reference_model(manifest: dict[str, Any]) -> nn.Module:
    """Rebuild the CPU reference from the artifact's recorded source, proven to be the same weights."""
    from neuron_port.models import build_model, load_model_dir
    from neuron_port.configs import load_config

    source = manifest["source"]
    if source.get("kind") == "shipped":
        model = build_model(load_config(source["name"], tiny=bool(source.get("tiny"))), seed=int(source.get("seed", 0)))
    elif source.get("kind") == "dir":
        if not Path(source["path"]).is_dir():
            raise ArtifactError(f"the reference checkpoint {source['path']} recorded in the manifest is not available here")
        model = load_model_dir(source["path"])
    else:
        raise ArtifactError(f"field source: expected kind 'shipped' or 'dir', found {source!r}")
    found = weights_fingerprint(checkpoint_state(model, clone=False))
    if found != manifest["weights_fingerprint"]:
        raise ArtifactError(
            f"the CPU reference rebuilt from {source} is not the artifact's checkpoint: weights fingerprint "
            f"expected {manifest['weights_fingerprint']}, found {found}; refusing to compare against the wrong oracle"
        )
    return model


def check_in_fresh_process(directory: str | Path, prompt_len: int = 24, max_new_tokens: int = 32,
                           timeout_s: float = 900) -> dict[str, Any]:
    """Load the artifact exactly as a server would — a new Python process, from the directory
    alone — generate, and compare with Hugging Face on the artifact's own checkpoint.

    Returns the ``neuron-port generate --check --json`` result (``seq_match``, ``tokens``,
    ``reference_tokens``, ``decode_tok_per_s``, ...). Raises ArtifactError with the child's
    message if it failed.
    """
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "neuron_port", "generate", str(directory), "--prompt-len", str(prompt_len),
           "--max-new-tokens", str(max_new_tokens), "--check", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not proc.stdout.strip().startswith("{"):
        raise ArtifactError(f"fresh-process check failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


__all__ = ["compile_artifact", "load_port", "generate_from_artifact", "reference_model", "check_in_fresh_process"]
