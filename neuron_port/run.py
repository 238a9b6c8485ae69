"""Run a port end to end: build it for one rank or N tensor-parallel ranks, generate, check.

This is what ``neuron-port port`` calls. A TP run saves the model to a temporary directory,
and every gloo rank loads it with the real directory loader, shards it with the model-level
plan, builds its own two-graph port (with its local KV-head counts), and runs the same greedy
loop; the row-parallel all-reduces keep the ranks' logits identical.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from neuron_port.layout import Layout, describe
from neuron_port.kvcache import naive_kv_bytes
from neuron_port.port import Port, greedy_generate, select_bucket


@dataclass
class GenerationJob:
    """Everything a rank needs to build its port and generate (JSON-able)."""

    prompts: list[list[int]]
    max_new_tokens: int
    buckets: list[int]
    kv_len: int
    stop_ids: list[int] = field(default_factory=list)
    ring_buffers: bool = True
    keep_logits: bool = False


def _generate_on(model: nn.Module, layout: Layout, job: GenerationJob, kv_heads=None) -> dict[str, Any]:
    port = Port(model, layout, job.buckets, job.kv_len, job.ring_buffers, kv_heads)
    result = greedy_generate(port, job.prompts, job.max_new_tokens, job.stop_ids, keep_logits=job.keep_logits)
    batch = len(job.prompts)
    dtype_bytes = port.dtype.itemsize
    out = {
        **result.to_json(),
        "kv_cache_bytes": port.spec.total_bytes(batch, dtype_bytes),
        "kv_cache_bytes_per_layer": {str(k): v for k, v in port.spec.bytes_per_layer(batch, dtype_bytes).items()},
        "dtype_bytes": dtype_bytes,
    }
    if job.keep_logits:
        out["step_logits"] = [l.tolist() for l in result.step_logits]
    return out


def _tp_rank(model_dir: str, job_dict: dict, tp: int, rank: int, reduce) -> dict[str, Any]:
    """One gloo rank: load, shard, build the port, generate (module level so spawn can import it)."""
    from neuron_port.models import load_model_dir
    from neuron_port.shard_model import shard_model
    from neuron_port.sharding import plan_model

    job = GenerationJob(**job_dict)
    model = load_model_dir(model_dir)
    layout = describe(model)
    plan = plan_model(layout, tp)
    shard = shard_model(model, layout, rank, tp, reduce, plan, inplace=True)
    return _generate_on(shard, layout, job, plan.local_kv_heads(rank))


def generate_with_port(model: nn.Module, job: GenerationJob, tp: int = 1, in_process: bool = False) -> dict[str, Any]:
    """Greedy generation through the two-graph port; ``tp > 1`` runs gloo ranks (or threads).

    ``model`` is not modified. The result's ``kv_cache_bytes`` sums every rank's store.
    """
    from neuron_port.sharding import plan_model

    layout = describe(model)
    select_bucket(max(len(p) for p in job.prompts), job.buckets)  # fail before any work
    if tp == 1:
        return _generate_on(copy.deepcopy(model), layout, job)
    plan = plan_model(layout, tp)  # validates the degree before anything is spawned
    if in_process:
        from neuron_port.parallel import run_in_process
        from neuron_port.shard_model import shard_model

        results = run_in_process(
            lambda rank, reduce: _generate_on(
                shard_model(model, layout, rank, tp, reduce, plan), layout, job, plan.local_kv_heads(rank)
            ),
            tp,
        )
    else:
        from neuron_port.models import save_model_dir
        from neuron_port.parallel import run_gloo

        with tempfile.TemporaryDirectory(prefix="neuron_port_model_") as model_dir:
            save_model_dir(model, model_dir)
            results = run_gloo(functools.partial(_tp_rank, model_dir, asdict(job), tp), tp)
    merged = dict(results[0])
    merged["kv_cache_bytes"] = sum(r["kv_cache_bytes"] for r in results)
    merged["per_rank_kv_cache_bytes"] = [r["kv_cache_bytes"] for r in results]
    for r in results[1:]:
        if r["tokens"] != results[0]["tokens"]:
            merged["rank_disagreement"] = True
    return merged


def naive_bytes_for(model: nn.Module, kv_len: int, batch: int, dtype_bytes: int) -> int:
    return naive_kv_bytes(describe(model), kv_len, batch, dtype_bytes)


__all__ = ["GenerationJob", "generate_with_port", "naive_bytes_for"]
