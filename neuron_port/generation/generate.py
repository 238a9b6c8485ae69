"""The public way to generate: :func:`generate`, from a model, an artifact directory or a built port.

One call, three sources, one request and one result type
(:class:`~neuron_port.generation.request.GenerationRequest`,
:class:`~neuron_port.generation.request.GenerationResult`):

* a model (``nn.Module``): every rank builds its graphs over its shard and generates (eager
  graphs; ``tp > 1`` as gloo processes or threads);
* an artifact directory: verified once, every rank loads its compiled graphs (no model, no
  Hugging Face forward: exactly what a server runs);
* a :class:`~neuron_port.graph.port.Port` already built (one rank, as it is).

Every source runs the one scheduler, the slot batch (:mod:`neuron_port.generation.slots`), through
:func:`~neuron_port.generation.offline.run_request`: every prompt prefilled at once, each row
decoding until it stops, greedy or sampled, stop ids or stop strings (with a tokenizer). The server's
engine (:mod:`neuron_port.serve.engine`) drives the same batch with requests joining as they arrive.
Every rank runs the same loop; the row-parallel all-reduces keep their logits identical, and a
disagreement is reported.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from neuron_port.artifacts.manifest import verify
from neuron_port.artifacts.reader import artifact_setup, load_rank_port
from neuron_port.artifacts.record import Manifest
from neuron_port.errors import ArtifactError
from neuron_port.families import family_of
from neuron_port.generation.drafting import ModelDrafter, drafter_over_port
from neuron_port.generation.offline import run_request
from neuron_port.generation.request import GenerationRequest, GenerationResult, merge_ranks
from neuron_port.generation.request_state import TokenEvent
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape, select_bucket
from neuron_port.model.layout import describe
from neuron_port.parallel.ranks import Mode, Rank, RankSetup, check_setup_matches, run_ranks

GenerationSource = Port | nn.Module | str | Path
"""What :func:`generate` runs: a model, a port, or an artifact directory."""


@dataclasses.dataclass(frozen=True)
class _RankWork:
    """What every rank is given: the request (rank 0 alone keeps logits), its tokenizer, and
    whether its result crosses a process (then it travels as :meth:`GenerationResult.to_wire`)."""

    request: GenerationRequest
    tokenizer: Any = None
    crosses_processes: bool = False
    on_token: Callable[[TokenEvent], None] | None = None  # rank 0, in this process only
    drafter: nn.Module | None = None  # a Gemma-4 drafter over the port's store (tp 1)


def _on_port(port: Port, work: _RankWork, rank: int = 0, drafter: ModelDrafter | None = None
             ) -> GenerationResult | dict[str, Any]:
    request = work.request if rank == 0 else work.request.without_logits()
    on_token = work.on_token if rank == 0 and not work.crosses_processes else None
    result = run_request(port, request, work.tokenizer, on_token=on_token, drafter=drafter)
    batch, dtype_bytes, spec = request.batch, port.inputs.dtype.itemsize, port.stores.largest
    result.per_rank_kv_cache_bytes = [spec.total_bytes(batch, dtype_bytes)]
    result.kv_cache_bytes_per_layer = {str(k): v for k, v in spec.bytes_per_layer(batch, dtype_bytes).items()}
    result.dtype_bytes = dtype_bytes
    return result.to_wire() if work.crosses_processes else result


def _model_rank(shape: PortShape, work: _RankWork, rank: Rank) -> GenerationResult | dict[str, Any]:
    port = Port.for_rank(rank, shape, returns_hidden=work.drafter is not None)
    if work.drafter is None:
        return _on_port(port, work, rank.rank)
    config = family_of(rank.model).text_config_of(rank.model)
    return _on_port(port, work, rank.rank, drafter_over_port(work.drafter, config, port))


def _artifact_rank(directory: str, manifest: Manifest, work: _RankWork, rank: Rank) -> GenerationResult | dict[str, Any]:
    return _on_port(load_rank_port(directory, manifest, rank), work, rank.rank)


def _merge(results: list[GenerationResult | dict[str, Any]]) -> GenerationResult:
    return merge_ranks([r if isinstance(r, GenerationResult) else GenerationResult.from_wire(r) for r in results])


def generate(
    source: GenerationSource,
    request: GenerationRequest,
    *,
    tokenizer: Any = None,
    shape: PortShape | None = None,
    setup: RankSetup | None = None,
    tp: int | None = None,
    mode: Mode = "gloo",
    manifest: Manifest | None = None,
    backend: str = "eager",
    on_token: Callable[[TokenEvent], None] | None = None,
    drafter: nn.Module | None = None,
) -> GenerationResult:
    """Run ``request`` through the two-graph port of ``source``.

    ``source``: a model, an artifact directory or a built :class:`Port`. For a model, ``shape``
    (prompt buckets, KV lengths; default 32,64,128 / 256) and ``setup`` (the shard plan; default:
    planned here at ``tp``, default 1) say what every rank builds; an artifact or a port brings its
    own, and giving them one is an error. ``manifest``: one :func:`neuron_port.artifacts.manifest.verify` already returned
    for an artifact (otherwise it is verified here). ``tokenizer``: what stop strings and the
    result's texts need (without one, texts are empty and stop strings are refused). ``backend``
    (a model only): ``eager`` runs every rank's graphs as they are (gloo processes or threads at
    tp > 1, by ``mode``); ``xla`` lowers them through torch-xla in this process (SPMD over tp
    devices) and the result carries the lowering report. ``on_token(event)`` is called with every token as it
    is made (its text released with a ``tokenizer``) where rank 0 runs in this process (tp 1, or threads); a
    run whose ranks are gloo processes calls it for none. ``drafter`` (a model at tp 1, eager): a Gemma-4 drafter
    (:func:`~neuron_port.model.drafter.load_drafter`) drafts ``request.draft_tokens`` per verify step, reading the
    port's store; without one, drafts come by prompt lookup.
    """
    longest = max(len(p) for p in request.prompts)
    if isinstance(source, nn.Module):
        shape = shape or PortShape((32, 64, 128), 256)
        if request.draft_tokens > shape.draft_tokens:  # verify graphs for the drafts, rings that hold them
            shape = PortShape(shape.buckets, shape.kv_lens, shape.ring_buffers, request.draft_tokens)
        select_bucket(longest, shape.buckets)  # fail before any work
        setup = _setup_for(source, setup, tp)
        _check_drafter_run(drafter, request, setup, backend)
        if backend == "xla":
            return _on_xla(source, request, tokenizer, setup, shape, on_token)
        if backend != "eager":
            raise ValueError(f"backend must be 'eager' or 'xla' for a model, found {backend!r}")
        crosses = setup.tp > 1 and mode == "gloo"
        work = _RankWork(request, tokenizer, crosses, None if crosses else on_token, drafter)
        return _merge(run_ranks(functools.partial(_model_rank, shape, work), setup, source, mode))
    if drafter is not None:
        raise ValueError("a drafter runs over a model's eager port for now: an artifact or a built port has no "
                         "drafter graph (generate from the model, or use prompt lookup)")
    if shape is not None or setup is not None or tp is not None or backend != "eager":
        raise ValueError("shape, setup, tp and backend describe what to build over a model; a port or an artifact "
                         "brings its own")
    if isinstance(source, Port):
        return _merge([_on_port(source, _RankWork(request, tokenizer, on_token=on_token))])
    manifest = manifest or verify(source)
    if manifest.batch != request.batch:
        raise ArtifactError(f"field batch: the graphs were compiled for batch {manifest.batch}, "
                            f"found {request.batch} prompts")
    select_bucket(longest, manifest.shape.buckets)
    setup = artifact_setup(source, manifest)
    if setup.tp > 1 and mode != "gloo":
        raise ValueError(f"a tp {setup.tp} artifact's graphs all-reduce over a process group: run it with mode='gloo'")
    crosses = setup.tp > 1
    work = _RankWork(request, tokenizer, crosses, None if crosses else on_token)
    return _merge(run_ranks(functools.partial(_artifact_rank, str(source), manifest, work), setup, None, mode))


def _check_drafter_run(drafter: nn.Module | None, request: GenerationRequest, setup: RankSetup, backend: str) -> None:
    """Refuse what a drafter cannot do yet, before any graph is built."""
    if drafter is None:
        return
    if not request.draft_tokens:
        raise ValueError("a drafter drafts request.draft_tokens per verify step: set draft_tokens >= 1")
    if setup.tp != 1 or backend != "eager":
        raise ValueError(f"a drafter reads the whole store of one eager port: tp 1 and backend 'eager', found tp "
                         f"{setup.tp} and backend {backend!r}")


def _on_xla(model: nn.Module, request: GenerationRequest, tokenizer: Any, setup: RankSetup,
            shape: PortShape, on_token: Callable[[TokenEvent], None] | None = None) -> GenerationResult:
    from neuron_port.backends.xla_port import xla_port

    # no decode graphs for fewer rows: each would be one more XLA compile for one run
    port, xla = xla_port(model, setup, shape, batch=request.batch, decode_rows=())
    result = _merge([_on_port(port, _RankWork(request, tokenizer, on_token=on_token))])
    result.lowering = xla.report()
    return result


def _setup_for(model: nn.Module, setup: RankSetup | None, tp: int | None) -> RankSetup:
    if setup is None:
        return RankSetup.for_layout(describe(model), tp or 1)
    if tp is not None and tp != setup.tp:
        raise ValueError(f"tp {tp} disagrees with the setup's shard plan (tp {setup.tp}); pass one of them")
    check_setup_matches(setup, model)
    return setup


__all__ = ["GenerationSource", "generate"]
