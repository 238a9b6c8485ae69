"""A two-graph port of one rank: host inputs, runners, and the graphs while it has them.

``Port`` is a small value: its :class:`~neuron_port.graph.host_inputs.HostInputs` (the rank's
:class:`~neuron_port.graph.shapes.StoreShapes`, embeddings, masks, one-hot writes), its
:class:`~neuron_port.graph.runners.Runners` (the graphs, eager or compiled) and its
:class:`~neuron_port.graph.graphs.GraphSet` (None once compiled runners replace them, or for a
port loaded from an artifact). The generation loop over it lives in
:mod:`neuron_port.generation.slots` (the one scheduler).

One constructor per source:

* :meth:`Port.over_model` — graphs over a model (unsharded, or a spread model with its local KV
  heads); the model is copied first, since the graphs switch its attention function;
* :meth:`Port.for_rank` — graphs over one tensor-parallel rank's shard (the rank's own copy), its
  local KV heads and KV-head gathers taken from the rank's shard plan;
* :meth:`Port.from_runners` — compiled runners loaded from an artifact, no model at all
  (:func:`neuron_port.artifacts.reader.load_rank_port` is the one way to get rank r's).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from neuron_port.errors import BucketError
from neuron_port.graph.contracts import GraphCompiler
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.graphs import GraphSet, build_graphs
from neuron_port.graph.host_inputs import HostInputs
from neuron_port.graph.kv import KVStore
from neuron_port.graph.runners import Runners, compile_graphs, eager_runners
from neuron_port.graph.shapes import PortShape, StoreShapes, decode_rows_for
from neuron_port.graph.step import StepInputs
from neuron_port.model.layout import Layout, describe

if TYPE_CHECKING:
    from neuron_port.parallel.ranks import Rank


class Port:
    """Host inputs + runners (+ graphs) for one model (one TP rank)."""

    def __init__(self, inputs: HostInputs, runners: Runners, graphs: GraphSet | None = None):
        self.inputs = inputs
        self.runners = runners
        self.graphs = graphs

    @classmethod
    def _build(cls, model: nn.Module, layout: Layout, shape: PortShape, kv_heads: dict[int, int] | None,
               kv_expand: Mapping[int, torch.Tensor] | None, one_store: bool, returns_hidden: bool = False) -> Port:
        """Eager graphs over ``model`` itself (which they change: callers pass a model of the port's own)."""
        stores = shape.stores(layout, kv_heads)
        graphs = build_graphs(model, stores, kv_expand, one_store, returns_hidden)
        return cls(HostInputs(layout, stores, HostEmbeddings.from_model(model)), eager_runners(graphs), graphs)

    @classmethod
    def over_model(cls, model: nn.Module, shape: PortShape, layout: Layout | None = None,
                   kv_heads: dict[int, int] | None = None, *, owned: bool = False, one_store: bool = False,
                   returns_hidden: bool = False) -> Port:
        """Graphs over a copy of ``model`` (``layout``: default ``describe(model)``; ``kv_heads``: a
        spread model's local KV-head count per layer). ``owned``: the caller hands over a model made
        for this port alone, and it is used without a copy. ``one_store``: every graph takes the store at the
        largest KV length (:func:`~neuron_port.graph.graphs.build_graphs`). ``returns_hidden``: the graphs also return
        the hidden state of their logits (a port a Gemma-4 drafter reads, :mod:`neuron_port.graph.drafter`)."""
        model = model if owned else copy.deepcopy(model)
        return cls._build(model, layout or describe(model), shape, kv_heads, None, one_store, returns_hidden)

    @classmethod
    def for_rank(cls, rank: Rank, shape: PortShape, one_store: bool = False, returns_hidden: bool = False) -> Port:
        """Graphs over a rank's shard, with its local KV-head counts and KV-head gathers (the rank's
        model is its own: it is used as it is); ``one_store``, ``returns_hidden``: see :meth:`over_model`."""
        if rank.model is None:
            raise ValueError(f"rank {rank.rank} has no model to build graphs over (an artifact rank: use from_runners)")
        return cls._build(rank.model, rank.layout, shape, rank.local_kv_heads, rank.kv_expand, one_store, returns_hidden)

    @classmethod
    def from_runners(cls, layout: Layout, stores: StoreShapes, embeddings: HostEmbeddings, runners: Runners) -> Port:
        """A port over runners loaded from an artifact (no model, no Hugging Face forward)."""
        return cls(HostInputs(layout, stores, embeddings), runners)

    # ---- compiling ---------------------------------------------------------------------------
    def compile(self, backend: GraphCompiler, batch: int = 1, desc: str = "compiling",
                decode_rows: Sequence[int] | None = None) -> None:
        """Replace every runner with the backend's compiled graph (:func:`runners.compile_graphs`).

        Graphs compiled by a static-shape backend take exactly ``batch`` rows from then on, and decode
        graphs come as well over each of ``decode_rows`` rows (default: the powers of two below ``batch``,
        :func:`~neuron_port.graph.shapes.occupancy_rows`; ``()`` for none), for steps with fewer rows occupied."""
        if self.graphs is None:
            raise ValueError("this port was loaded from compiled runners; there are no graphs left to compile")
        rows = decode_rows_for(batch, decode_rows)
        self.runners = compile_graphs(self.graphs, backend, self.example_inputs, batch, desc, rows)

    def release_graphs(self) -> None:
        """Drop the graphs (and with them the model they run) once compiled runners replace them:
        a slim host keeps only the runners and the embeddings."""
        if not self.runners.compiled:
            raise ValueError("the runners are still the eager graphs; compile before releasing them")
        self.graphs = None

    def example_inputs(self, kind: str, size: int, batch: int = 1, store_rows: int | None = None
                       ) -> tuple[StepInputs, KVStore]:
        """Inputs of ``batch`` rows and a store of the right shapes for tracing the ``kind`` graph of ``size``. For
        graphs over one store, the store is that one: the largest KV length, ``store_rows`` rows (default ``batch``;
        a decode graph of fewer rows takes the whole store)."""
        if self.graphs is not None and self.graphs.one_store:
            return self.inputs.example_step(kind, size, batch), self.inputs.new_store(store_rows or batch, self.stores.kv_len)
        if kind == "verify":
            return self.inputs.example_verify(size, batch)
        return self.inputs.example_prefill(size, batch) if kind == "prefill" else self.inputs.example_decode(size, batch)

    def check_batch(self, rows: int) -> None:
        """Raise :class:`BucketError` when compiled runners cannot take ``rows`` rows."""
        if self.batch is not None and rows != self.batch:
            raise BucketError(f"the compiled graphs take batch {self.batch}, found {rows} prompts; pad the batch to "
                              f"{self.batch} rows (the server's engine does) or compile with batch={rows}")

    # ---- views -------------------------------------------------------------------------------
    @property
    def layout(self) -> Layout:
        return self.inputs.layout

    @property
    def stores(self) -> StoreShapes:
        """KV store shapes by length (``stores.specs``, ``stores.prefill_kv``, ``stores.rings``)."""
        return self.inputs.stores

    @property
    def buckets(self) -> list[int]:
        return self.stores.buckets

    @property
    def kv_len(self) -> int:
        """The largest KV length (how far a request can grow)."""
        return self.stores.kv_len

    @property
    def batch(self) -> int | None:
        """Rows the runners take: None while they are eager graphs (any batch)."""
        return self.runners.batch


__all__ = ["Port"]
