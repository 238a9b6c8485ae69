"""Tensor-parallel ranks: the shard plan made once, a :class:`Rank` per rank, one way to run them.

Every command of the library takes the same path from a model to its ranks:

1. :meth:`RankSetup.for_layout` plans the sharding once per run (the only place a run plans it);
2. :func:`run_ranks` runs a function on every rank, as threads of this process (``"threads"``)
   or as gloo processes on 127.0.0.1 (``"gloo"``); at tp 1 it simply calls it;
3. in each rank, :func:`make_rank` shards the model by that plan and hands the function a
   :class:`Rank`: rank, tp, layout, family, plan, local KV heads, KV-head gathers, the reduce
   function and the sharded model.

Porting, compiling, loading artifacts, generating and the doctor are all functions of a
``Rank``; none of them plans, spawns or shards on its own.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from neuron_port.families import DecoderFamily
from neuron_port.model.layout import Layout, describe
from neuron_port.model.loading import load_model_dir, save_model_dir
from neuron_port.parallel.launch import Reduce, identity_reduce, run_gloo, run_in_process
from neuron_port.parallel.shard_model import shard_model
from neuron_port.parallel.sharding import ModelShardPlan, plan_model

Mode = Literal["threads", "gloo"]
ModelSource = nn.Module | str | Path | None
"""Where a rank's weights come from: a model in memory, a model directory, or none (a rank that
runs compiled graphs from an artifact)."""


@dataclasses.dataclass(frozen=True)
class RankSetup:
    """What every rank of one run shares: the layout and the shard plan (picklable)."""

    layout: Layout
    plan: ModelShardPlan

    @classmethod
    def for_layout(cls, layout: Layout, tp: int) -> RankSetup:
        """Plan the sharding of ``layout`` at ``tp`` (raises ShardingError naming the valid degrees)."""
        return cls(layout, plan_model(layout, tp))

    @property
    def tp(self) -> int:
        return self.plan.tp


def check_setup_matches(setup: RankSetup, model: nn.Module) -> None:
    """Refuse a setup planned for another model (its layout would shard this one wrongly)."""
    found = describe(model)
    if dataclasses.replace(found, disagreements=()) != dataclasses.replace(setup.layout, disagreements=()):
        raise ValueError(f"the setup was planned for another layout ({setup.layout.model_type}, {setup.layout.num_layers} "
                         f"layers) than the model's ({found.model_type}, {found.num_layers} layers); plan it from this model")


@dataclasses.dataclass
class Rank:
    """One rank of a run, made once and carried: what it is and the model shard it owns.

    ``model`` is None for a rank that runs compiled graphs loaded from an artifact.
    """

    rank: int
    setup: RankSetup
    reduce: Reduce
    model: nn.Module | None = None

    @property
    def tp(self) -> int:
        return self.setup.tp

    @property
    def layout(self) -> Layout:
        return self.setup.layout

    @property
    def plan(self) -> ModelShardPlan:
        return self.setup.plan

    @property
    def family(self) -> DecoderFamily:
        return self.layout.family

    @property
    def local_kv_heads(self) -> dict[int, int]:
        """Layer index -> KV heads this rank holds (the size of its KV buffers)."""
        return self.plan.local_kv_heads(self.rank)

    @property
    def kv_expand(self) -> dict[int, torch.Tensor]:
        """Layer index -> KV-head gather for the layers where this rank's query heads straddle KV groups."""
        return self.plan.kv_expand(self.rank)


def make_rank(setup: RankSetup, rank: int, reduce: Reduce, model: nn.Module | None, inplace: bool = False) -> Rank:
    """Rank ``rank`` with its shard of ``model`` (a copy unless ``inplace``; tp 1 copies whole)."""
    if model is not None:
        if setup.tp == 1:
            model = model if inplace else copy.deepcopy(model)
        else:
            model = shard_model(model, setup.layout, setup.plan, rank, reduce, inplace=inplace)
    return Rank(rank, setup, reduce, model)


def _load(source: ModelSource) -> nn.Module | None:
    return load_model_dir(source) if isinstance(source, (str, Path)) else source


def _gloo_rank(fn: Callable[[Rank], Any], setup: RankSetup, model_dir: str | None, dtype: str, rank: int,
               reduce: Reduce) -> Any:
    """One gloo process: load the weights (in ``dtype``, the model's), take its shard, run ``fn``
    (module level: spawn imports it)."""
    model = load_model_dir(model_dir, dtype=getattr(torch, dtype)) if model_dir is not None else None
    return fn(make_rank(setup, rank, reduce, model, inplace=True))


def run_ranks(fn: Callable[[Rank], Any], setup: RankSetup, model: ModelSource = None, mode: Mode = "gloo",
              timeout_s: float = 600.0) -> list[Any]:
    """``fn(rank)`` on every rank of ``setup``; results in rank order.

    ``model`` is never modified: each rank gets its own shard (at tp 1, a copy; a directory is
    loaded in the rank). ``"gloo"`` runs each rank in a fresh process (``fn`` must be importable,
    e.g. a module-level function or a ``functools.partial`` of one, and return JSON-able data);
    a model in memory is saved to a temporary directory that every process loads.
    """
    if setup.tp == 1:
        loaded = _load(model)
        return [fn(make_rank(setup, 0, identity_reduce, loaded, inplace=loaded is not model))]
    if mode == "threads":
        loaded = _load(model)
        return run_in_process(lambda rank, reduce: fn(make_rank(setup, rank, reduce, loaded)), setup.tp)
    if mode != "gloo":
        raise ValueError(f"mode must be 'threads' or 'gloo', found {mode!r}")
    if not isinstance(model, nn.Module):
        directory = str(model) if model is not None else None
        return run_gloo(functools.partial(_gloo_rank, fn, setup, directory, "float32"), setup.tp, timeout_s)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory(prefix="neuron_port_model_") as directory:
        save_model_dir(model, directory)
        return run_gloo(functools.partial(_gloo_rank, fn, setup, directory, dtype), setup.tp, timeout_s)


__all__ = ["RankSetup", "Rank", "Mode", "ModelSource", "check_setup_matches", "make_rank", "run_ranks"]
