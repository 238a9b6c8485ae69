"""The public way to generate: :func:`generate`, from a model, an artifact directory or a built port.

One call, three sources, one result type:

* a model (``nn.Module``): every rank builds its graphs over its shard and generates (eager
  graphs; ``tp > 1`` as gloo processes or threads);
* an artifact directory: verified once, every rank loads its compiled graphs (no model, no
  Hugging Face forward: exactly what a server runs);
* a :class:`~neuron_port.graph.port.Port` already built (one rank, as it is).

Generation is greedy here (the checks compare it with Hugging Face); sampling, streaming and
batching of live requests are the :class:`~neuron_port.generation.static_batch.Generator`'s. Every rank runs
the same loop; the row-parallel all-reduces keep their logits identical, and a disagreement is
reported.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from neuron_port.artifacts.manifest import verify

from neuron_port.errors import ArtifactError
from neuron_port.artifacts.reader import artifact_setup, load_rank_port
from neuron_port.model.layout import describe
from neuron_port.graph.port import Port
from neuron_port.parallel.ranks import Mode, Rank, RankSetup, check_setup_matches, run_ranks
from neuron_port.generation.static_batch import GreedyResult, greedy_generate
from neuron_port.graph.shapes import PortShape, select_bucket

Target = Port | nn.Module | str | Path


@dataclass
class GenerationResult(GreedyResult):
    """Rank 0's tokens and timings, with what every rank's KV store held.

    ``per_rank_kv_cache_bytes``: each rank's store at the largest KV length;
    ``kv_cache_bytes_per_layer``: rank 0's, by owner layer; ``rank_disagreement``: some rank
    produced other tokens than rank 0 (a broken collective)."""

    per_rank_kv_cache_bytes: list[int] = field(default_factory=list)
    kv_cache_bytes_per_layer: dict[str, int] = field(default_factory=dict)
    dtype_bytes: int = 4
    rank_disagreement: bool = False

    @property
    def kv_cache_bytes(self) -> int:
        return sum(self.per_rank_kv_cache_bytes)

    def to_json(self) -> dict[str, Any]:
        out = {**super().to_json(), "kv_cache_bytes": self.kv_cache_bytes,
               "per_rank_kv_cache_bytes": self.per_rank_kv_cache_bytes,
               "kv_cache_bytes_per_layer": self.kv_cache_bytes_per_layer, "dtype_bytes": self.dtype_bytes}
        if self.rank_disagreement:
            out["rank_disagreement"] = True
        return out


@dataclass(frozen=True)
class _Job:
    prompts: list[list[int]]
    max_new_tokens: int
    stop_ids: list[int]
    keep_logits: bool
    crosses_processes: bool = False  # results travel as JSON: logits as lists


def _run_port(port: Port, job: _Job) -> dict[str, Any]:
    """Generate on one rank's port; the rank's result as JSON-able data."""
    result = greedy_generate(port, job.prompts, job.max_new_tokens, job.stop_ids, keep_logits=job.keep_logits)
    batch, dtype_bytes = len(job.prompts), port.dtype.itemsize
    out = {**result.to_json(), "kv_cache_bytes": port.spec.total_bytes(batch, dtype_bytes), "dtype_bytes": dtype_bytes,
           "kv_cache_bytes_per_layer": {str(k): v for k, v in port.spec.bytes_per_layer(batch, dtype_bytes).items()}}
    if job.keep_logits:
        out["step_logits"] = [l.tolist() for l in result.step_logits] if job.crosses_processes else result.step_logits
    return out


def _rank_job(job: _Job, rank: Rank) -> _Job:
    """Only rank 0's logits are returned: the other ranks keep none (they would travel as JSON)."""
    return job if rank.rank == 0 else dataclasses.replace(job, keep_logits=False)


def _model_rank(shape: PortShape, job: _Job, rank: Rank) -> dict[str, Any]:
    return _run_port(Port.for_rank(rank, shape), _rank_job(job, rank))


def _artifact_rank(directory: str, manifest: dict[str, Any], job: _Job, rank: Rank) -> dict[str, Any]:
    return _run_port(load_rank_port(directory, manifest, rank), _rank_job(job, rank))


def _merge(results: list[dict[str, Any]]) -> GenerationResult:
    first = results[0]
    return GenerationResult(
        tokens=first["tokens"], finish_reasons=first["finish_reasons"], prefill_s=first["prefill_s"],
        decode_s=first["decode_s"], decode_steps=first["decode_steps"], host_s=first["host_s"],
        step_logits=[torch.as_tensor(step) for step in first.get("step_logits", [])],
        per_rank_kv_cache_bytes=[r["kv_cache_bytes"] for r in results],
        kv_cache_bytes_per_layer=first["kv_cache_bytes_per_layer"], dtype_bytes=first["dtype_bytes"],
        rank_disagreement=any(r["tokens"] != first["tokens"] for r in results[1:]),
    )


def generate(
    target: Target,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    stop_ids: Sequence[int] = (),
    shape: PortShape | None = None,
    setup: RankSetup | None = None,
    tp: int | None = None,
    mode: Mode = "gloo",
    keep_logits: bool = False,
    manifest: dict[str, Any] | None = None,
) -> GenerationResult:
    """Greedy generation of ``prompts`` (lists of token ids) through the two-graph port.

    ``target``: a model, an artifact directory or a built :class:`Port`. For a model, ``shape``
    (prompt buckets, KV lengths; default 32,64,128 / 256) and ``setup`` (the shard plan; default:
    planned here at ``tp``, default 1) say what every rank builds; an artifact or a port brings its
    own, and giving them one is an error. ``manifest``: one :func:`neuron_port.artifacts.manifest.verify` already returned
    for an artifact (otherwise it is verified here). ``keep_logits``: rank 0's raw logits of every
    step, before the host softcap.
    """
    job = _Job([list(p) for p in prompts], int(max_new_tokens), list(stop_ids), keep_logits)
    if isinstance(target, nn.Module):
        shape = shape or PortShape((32, 64, 128), 256)
        select_bucket(max(len(p) for p in job.prompts), shape.buckets)  # fail before any work
        setup = _setup_for(target, setup, tp)
        job = dataclasses.replace(job, crosses_processes=setup.tp > 1 and mode == "gloo")
        return _merge(run_ranks(functools.partial(_model_rank, shape, job), setup, target, mode))
    if shape is not None or setup is not None or tp is not None:
        raise ValueError("shape, setup and tp describe what to build over a model; a port or an artifact brings its own")
    if isinstance(target, Port):
        return _merge([_run_port(target, job)])
    manifest = manifest or verify(target)
    if int(manifest["batch"]) != len(job.prompts):
        raise ArtifactError(f"field batch: the graphs were compiled for batch {manifest['batch']}, "
                            f"found {len(job.prompts)} prompts")
    select_bucket(max(len(p) for p in job.prompts), manifest["buckets"])
    setup = artifact_setup(target, manifest)
    if setup.tp > 1 and mode != "gloo":
        raise ValueError(f"a tp {setup.tp} artifact's graphs all-reduce over a process group: run it with mode='gloo'")
    job = dataclasses.replace(job, crosses_processes=setup.tp > 1)
    return _merge(run_ranks(functools.partial(_artifact_rank, str(target), manifest, job), setup, None, mode))


def _setup_for(model: nn.Module, setup: RankSetup | None, tp: int | None) -> RankSetup:
    if setup is None:
        return RankSetup.for_layout(describe(model), tp or 1)
    if tp is not None and tp != setup.tp:
        raise ValueError(f"tp {tp} disagrees with the setup's shard plan (tp {setup.tp}); pass one of them")
    check_setup_matches(setup, model)
    return setup


__all__ = ["GenerationResult", "generate"]
