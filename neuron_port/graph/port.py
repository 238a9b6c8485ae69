"""A two-graph port of one rank: host inputs, runners, KV store shapes.

``Port`` holds one rank's :class:`~neuron_port.graph.shapes.StoreShapes`, its
:class:`~neuron_port.graph.host_inputs.HostInputs` (embeddings, masks, one-hot writes) and its
:class:`~neuron_port.graph.runners.Runners` (the graphs, eager or compiled). The generation
loop over it lives in :mod:`neuron_port.generation.static_batch`.

Ways to make one:

* ``Port(model, layout, buckets, kv_lens)`` — graphs over an unsharded model (tp 1);
* :meth:`Port.for_rank` — graphs over one tensor-parallel rank's shard, its local KV heads and
  KV-head gathers taken from the rank's shard plan;
* :meth:`Port.from_runners` — compiled runners loaded from an artifact, no model at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import torch
from torch import nn

from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.errors import BucketError
from neuron_port.graph.graphs import DecodeGraph, GraphSet, build_graphs
from neuron_port.graph.host_inputs import HostInputs
from neuron_port.graph.kv import KVStore, KVStoreSpec
from neuron_port.model.layout import Layout
from neuron_port.graph.runners import Runners, compile_graphs, eager_runners
from neuron_port.graph.shapes import PortShape, StoreShapes, select_bucket
from neuron_port.graph.step import Runnable, StepInputs

if TYPE_CHECKING:
    from neuron_port.parallel.ranks import Rank


class Port:
    """Host inputs + runners + KV store shapes for one model (one TP rank)."""

    def __init__(
        self,
        model: nn.Module | None,
        layout: Layout,
        prompt_buckets: Sequence[int],
        kv_lens: int | Sequence[int],
        ring_buffers: bool = True,
        kv_heads: dict[int, int] | None = None,
        embeddings: HostEmbeddings | None = None,
        runners: tuple[dict[int, Runnable], dict[int, Runnable]] | None = None,
        batch: int | None = None,
        kv_expand: Mapping[int, torch.Tensor] | None = None,
    ):
        """Build graphs over ``model``, or (``model=None``) use ``runners`` = (prefill by bucket,
        decode by KV length) together with ``embeddings``; ``batch``: the rows such runners were
        compiled for (None: any). ``kv_heads`` and ``kv_expand`` describe a tensor-parallel
        shard (see :meth:`for_rank`, which fills them from the rank's plan)."""
        if model is None and (runners is None or embeddings is None):
            raise ValueError("a Port without a model needs both runners and embeddings")
        stores = PortShape(prompt_buckets, kv_lens, ring_buffers).stores(layout, kv_heads)
        graphs = build_graphs(model, stores, kv_expand) if model is not None else None
        if runners is not None:
            ready = Runners(dict(runners[0]), dict(runners[1]), batch, compiled=True)
        else:
            ready = eager_runners(graphs)
        self._assemble(layout, stores, embeddings or HostEmbeddings.from_model(model), ready, graphs)

    def _assemble(self, layout: Layout, stores: StoreShapes, embeddings: HostEmbeddings, runners: Runners,
                  graphs: GraphSet | None) -> None:
        self.inputs = HostInputs(layout, stores, embeddings)
        self.runners = runners
        self.graphs = graphs

    @classmethod
    def for_rank(cls, rank: "Rank", shape: PortShape) -> "Port":
        """Graphs over a rank's shard, with its local KV-head counts and KV-head gathers."""
        if rank.model is None:
            raise ValueError(f"rank {rank.rank} has no model to build graphs over (an artifact rank: use from_runners)")
        return cls(rank.model, rank.layout, shape.buckets, shape.kv_lens, shape.ring_buffers,
                   kv_heads=rank.local_kv_heads, kv_expand=rank.kv_expand)  # the stores of shape.rank_stores(setup)[rank]

    @classmethod
    def from_runners(cls, layout: Layout, stores: StoreShapes, embeddings: HostEmbeddings, runners: Runners) -> "Port":
        """A port over runners loaded from an artifact (no model, no Hugging Face forward)."""
        port = cls.__new__(cls)
        port._assemble(layout, stores, embeddings, runners, None)
        return port

    # ---- compiling ---------------------------------------------------------------------------
    def compile(self, backend, batch: int = 1, desc: str = "compiling") -> None:
        """Replace every runner with the backend's compiled graph (:func:`runners.compile_graphs`).

        Graphs compiled by a static-shape backend take exactly ``batch`` rows from then on."""
        if self.graphs is None:
            raise ValueError("this port was loaded from compiled runners; there are no graphs left to compile")
        self.runners = compile_graphs(self.graphs, backend, self.example_inputs, batch, desc)

    def release_graphs(self) -> None:
        """Drop the graphs (and with them the model they run) once compiled runners replace them:
        a slim host keeps only the runners and the embeddings."""
        if not self.runners.compiled:
            raise ValueError("the runners are still the eager graphs; compile before releasing them")
        self.graphs = None

    def example_inputs(self, kind: str, size: int, batch: int = 1) -> tuple[StepInputs, KVStore]:
        """Inputs and a store of the right shapes for tracing the ``kind`` graph of ``size``."""
        if kind == "prefill":
            return self.inputs.example_prefill(size, batch)
        return self.inputs.example_decode(size, batch)

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
        return self.inputs.stores

    @property
    def embeddings(self) -> HostEmbeddings:
        return self.inputs.embeddings

    @property
    def dtype(self) -> torch.dtype:
        return self.inputs.dtype

    @property
    def buckets(self) -> list[int]:
        return self.stores.buckets

    @property
    def kv_lens(self) -> list[int]:
        return self.stores.kv_lens

    @property
    def kv_len(self) -> int:
        """The largest KV length (how far a request can grow)."""
        return self.stores.kv_len

    @property
    def specs(self) -> dict[int, KVStoreSpec]:
        return self.stores.specs

    @property
    def spec(self) -> KVStoreSpec:
        """The store at the largest KV length."""
        return self.specs[self.kv_len]

    @property
    def prefill_kv(self) -> dict[int, int]:
        return self.stores.prefill_kv

    @property
    def rings(self) -> dict[int, int | None]:
        return self.stores.rings

    @property
    def batch(self) -> int | None:
        """Rows the runners take: None while they are eager graphs (any batch)."""
        return self.runners.batch

    @property
    def prefill_runners(self) -> dict[int, Runnable]:
        return self.runners.prefill

    @property
    def decode_runners(self) -> dict[int, Runnable]:
        return self.runners.decode

    @property
    def prefill_graphs(self) -> dict:
        return self.graphs.prefill if self.graphs is not None else {}

    @property
    def decode_graphs(self) -> dict:
        return self.graphs.decode if self.graphs is not None else {}

    @property
    def decode_graph(self) -> DecodeGraph:
        return self.decode_graphs[self.kv_len]

    # ---- list forms of earlier releases (kept for one release; use ``port.inputs``) -----------
    def host_inputs_prefill(self, ids: torch.Tensor, lengths: torch.Tensor, bucket: int) -> list[torch.Tensor]:
        """ids [batch, bucket] right-padded, lengths [batch] -> the prefill step's 8 inputs, as a list."""
        return list(self.inputs.prefill(ids, lengths, bucket))

    def host_inputs_decode(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int | None = None) -> list[torch.Tensor]:
        """tokens [batch], positions [batch] -> the decode step's 8 inputs (fresh tensors), as a list."""
        return list(self.inputs.decode_fresh(tokens, positions, kv_len or self.kv_len))

    def decode_inputs(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int | None = None) -> list[torch.Tensor]:
        """The decode step's 8 inputs written into preallocated tensors (reused every step), as a list."""
        return list(self.inputs.decode(tokens, positions, kv_len or self.kv_len))

    def example_inputs_prefill(self, bucket: int, batch: int = 1) -> list[torch.Tensor]:
        """Flat tracing inputs of a prefill graph (step inputs, then the store)."""
        inputs, store = self.inputs.example_prefill(bucket, batch)
        return [*inputs, *store]

    def example_inputs_decode(self, kv_len: int, batch: int = 1) -> list[torch.Tensor]:
        """Flat tracing inputs of a decode graph (step inputs, then the store)."""
        inputs, store = self.inputs.example_decode(kv_len, batch)
        return [*inputs, *store]

    def new_store(self, batch: int, kv_len: int | None = None) -> list[torch.Tensor]:
        """A zeroed store in graph order, as a list (``port.inputs.new_store`` gives a KVStore)."""
        return self.inputs.new_store(batch, kv_len or self.kv_len).tensors()

    def grow_store(self, store: list[torch.Tensor], old_kv: int, new_kv: int, last_position: torch.Tensor) -> list[torch.Tensor]:
        """A store (list form) at ``old_kv`` copied into ``new_kv`` (see :meth:`KVStore.grow`)."""
        return KVStore.from_tensors(self.specs[old_kv], store).grow(self.specs[new_kv], last_position).tensors()


__all__ = ["Port", "select_bucket"]
