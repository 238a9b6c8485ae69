"""An nxd artifact: every graph traced by one neuronx-distributed ModelBuilder, and loaded back as runners.

One host process drives every NeuronCore: NxD's executor holds all ``tp`` ranks, routes each call
to the graph whose example inputs had the same shapes, and keeps the KV store on the device as
its state, one state shared by every graph. So an nxd artifact has a single host rank
(``rank0/``) whatever its tp, and one store, allocated once at the largest KV length::

    rank0/model.pt                                    the executor (torch.jit.save of ModelBuilder.trace)
    rank0/weights/tp{r}_sharded_checkpoint.safetensors one shard per NeuronCore (ModelBuilder.shard_checkpoint)
    rank0/nxd_graphs.json                             every graph file's ModelBuilder key, input count and (decode)
                                                      KV length; the store's bytes per core

Decode by length: a decode graph per KV length of the artifact, each reading a static prefix of that
one store (:class:`~neuron_port.graph.graphs.DecodeGraph` over ``store=``) and keyed by a ``slot_ids
[kv_len]`` input, so the executor tells them apart by shape (NxD Inference keys its token-generation
buckets by an input shaped by the KV length in the same way). The host picks the smallest length that
holds the context, and moving to the next length copies nothing on the device.

The host side keeps running the library's step loop unchanged: a :class:`ResidentKVRunner` takes
the step inputs and a host placeholder of the store (returned untouched; the real store is on the
device). The compiler's work directory is kept outside the artifact.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from neuron_port.backends.leading_update import leading_update
from neuron_port.backends.nxd import (
    KVResident,
    ResidentKVRunner,
    build,
    check_nxd_supported,
    device_copy,
    load,
    parallelize_for_nxd,
)
from neuron_port.backends.nxd_checkpoint import traced_checkpoint
from neuron_port.errors import ArtifactError, NeuronPortError
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.graphs import DecodeGraph, PrefillGraph
from neuron_port.graph.host_inputs import HostInputs
from neuron_port.graph.kv import KVWrite
from neuron_port.graph.runners import runner_file
from neuron_port.graph.shapes import PortShape, StoreShapes, decode_rows_for
from neuron_port.model.tensorfile import read_header
from neuron_port.parallel.ranks import RankSetup
from neuron_port.progress import progress

GRAPHS_FILE = "nxd_graphs.json"
DECODE_KV_WRITE = KVWrite.ROWS
"""Decode graphs traced by ModelBuilder write their new K/V rows by a scatter into the aliased store
(what NxD Inference's ``kv_cache_manager`` does), not by a blend over the whole store."""


def resident_factory(model: nn.Module, setup: RankSetup, stores: StoreShapes, kind: str, size: int,
                      kv_shapes: list[torch.Size], kv_dtype: torch.dtype, prefill_update: bool = False,
                      rows: int | None = None) -> Callable[[], KVResident]:
    """What ModelBuilder's ``load_module`` calls under NxD's parallel state: a :func:`device_copy` of
    ``model`` (no host tables, its own head, the original's tensors shared) with the plan's parallel
    layers, its ``kind`` graph of ``size``, the rank-local KV store as parameters: one store for every
    graph, at the largest KV length (``stores.largest``, ``kv_shapes`` its tensors' shapes).

    A prefill writes its prompt's rows into that store by position (``prefill_update``: into a full-length
    buffer by one dynamic-update-slice on the device, :func:`~neuron_port.backends.leading_update.leading_update`,
    not yet compiled by neuronx-cc; otherwise ``slice_scatter``). A decode graph of KV length
    ``size`` takes ``slot_ids [size]`` after its step inputs (what keys it by length: NxD's executor
    routes a call by its input shapes), attends over the first slots of each owner that a store of
    ``size`` has (a static prefix), and writes its new rows only, into the whole buffer
    (:func:`~neuron_port.graph.kv.row_write`: a scatter along the sequence into the aliased store, NxD
    Inference's own decode write). ``rows``: a decode graph over the store's first ``rows`` rows only (decode
    by occupancy: its inputs' batch routes a step to it), written back into them by a slice update."""
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype

    def make() -> KVResident:
        shard = parallelize_for_nxd(device_copy(model), setup, dtype)
        if kind == "prefill":
            graph: nn.Module = PrefillGraph(shard, stores.largest, size)
            if prefill_update:  # one dynamic-update-slice per buffer, as NxD Inference writes it
                graph.leading_update = leading_update
        else:
            graph = DecodeGraph(shard, stores.specs[size], store=stores.largest, rows=rows)
            graph.kv_write = DECODE_KV_WRITE
            graph.slot_input = True
        return KVResident(graph, kv_shapes, kv_dtype)

    return make


def slot_ids(kv_len: int) -> torch.Tensor:
    """``[kv_len]`` int64: the position each full slot of a decode graph's prefix holds (its routing input)."""
    return torch.arange(kv_len, dtype=torch.long)


def write_nxd_rank(rank_dir: Path, model: nn.Module, setup: RankSetup, shape: PortShape, batch: int,
                   compiler_args: str = "--model-type=transformer --auto-cast=none", prefill_update: bool = False,
                   decode_rows: Sequence[int] | None = None) -> dict[str, Any]:
    """Trace every graph of ``shape`` with one ModelBuilder at ``setup.tp`` and save the executor,
    the per-core shards and the key of every graph file into ``rank_dir``. ``model`` is not modified.
    Decode graphs come at ``batch`` rows and at each of ``decode_rows`` (default: the powers of two below
    ``batch``), all over the one resident store: one more key set per row count, no second store.

    Returns what the manifest records of the host rank: the KV layout of its host-side placeholder
    store (the whole model's, as a tp 1 rank sees it) and the facts of its runners."""
    check_nxd_supported(model, setup)
    local = shape.stores(setup.layout, setup.plan.local_kv_heads(0))  # every rank's store (uniform plans only)
    inputs = HostInputs(setup.layout, local, HostEmbeddings.from_model(model))
    state = inputs.new_store(batch, local.kv_len).tensors()  # the one store every graph aliases
    kv_shapes, kv_dtype = [t.shape for t in state], state[0].dtype
    graphs, keys = {}, {}
    decode_rows = decode_rows_for(batch, decode_rows)
    jobs = [("prefill", b, None) for b in local.buckets] + [("decode", kv, None) for kv in local.kv_lens]
    jobs += [("decode", kv, rows) for rows in decode_rows for kv in local.kv_lens]
    for kind, size, rows in jobs:
        file = runner_file(kind, size, rows)
        key = file.removesuffix(".pt")
        if kind == "prefill":
            step = list(inputs.example_prefill(size, batch)[0])
            keys[file] = {"key": key, "inputs": len(step)}
        else:
            step = [*inputs.example_decode(size, rows or batch)[0], slot_ids(size)]
            keys[file] = {"key": key, "inputs": len(step) - 1, "slot_ids": size}
        graphs[key] = (resident_factory(model, setup, local, kind, size, kv_shapes, kv_dtype, prefill_update, rows), step)
    rank_dir.mkdir(parents=True, exist_ok=True)
    bar = progress(total=len(graphs), desc=f"tracing graphs (ModelBuilder, tp {setup.tp})", unit="graph")
    graphs = {key: (_ticking(make, bar), step) for key, (make, step) in graphs.items()}  # ModelBuilder builds each key once
    with tempfile.TemporaryDirectory(prefix="neuron-port-nxd-") as workdir:
        build(graphs, lambda: traced_checkpoint(model, setup), setup.tp, rank_dir, compiler_args, compiler_workdir=workdir)
    bar.close()
    state_bytes = sum(t.numel() * t.element_size() for t in state)
    (rank_dir / GRAPHS_FILE).write_text(json.dumps({"tp": setup.tp, "graphs": keys, "kv_state_bytes_per_core": state_bytes},
                                                   indent=2))
    host = shape.stores(setup.layout)
    return {"kv_layout": host.kv_layout(), "runners": {"kv_write": DECODE_KV_WRITE.value,
                                                       "resident_kv": True, "decode_rows": list(decode_rows),
                                                       "prefill_write": "dynamic-update-slice" if prefill_update
                                                       else "slice_scatter"}}


def _ticking(make: Callable[[], KVResident], bar: Any) -> Callable[[], KVResident]:
    """``make`` that moves ``bar`` on by one each time ModelBuilder builds its key's module."""
    def made() -> KVResident:
        module = make()
        bar.update(1)
        return module

    return made


def shard_bytes(rank_dir: Path) -> list[int]:
    """Bytes of the tensors in each core's shard (``weights/tp{r}_sharded_checkpoint.safetensors``),
    from the files' headers (each tensor's data offsets), in core order."""
    tp = int(json.loads((Path(rank_dir) / GRAPHS_FILE).read_text())["tp"])
    out = []
    for r in range(tp):
        entries, _ = read_header(Path(rank_dir) / "weights" / f"tp{r}_sharded_checkpoint.safetensors")
        out.append(sum(entry["data_offsets"][1] - entry["data_offsets"][0] for entry in entries.values()))
    return out


def kv_state_bytes(rank_dir: Path) -> int:
    """Bytes of the one KV store each core holds (the state every graph aliases), as the build recorded it."""
    return int(json.loads((Path(rank_dir) / GRAPHS_FILE).read_text())["kv_state_bytes_per_core"])


class NxdBackend:
    """Loads an nxd artifact's graphs (an :class:`~neuron_port.graph.contracts.ArtifactGraphs`); it compiles
    nothing graph by graph: :func:`write_nxd_rank` builds the whole artifact."""

    name = "nxd"
    kv_write = DECODE_KV_WRITE

    def load_graphs(self, rank_dir: Path, files: list[str], host: Mapping[str, torch.Tensor]) -> dict[str, ResidentKVRunner]:
        """The executor loaded once and initialised with every core's shard; one runner per graph file."""
        graphs_file = Path(rank_dir) / GRAPHS_FILE
        if not graphs_file.is_file():
            raise ArtifactError(f"{graphs_file} is missing: this {self.name} artifact was not written by ModelBuilder (an "
                                f"earlier neuron backend traced each graph on its own); rebuild it with "
                                f"'neuron-port compile MODEL --backend {self.name} --out DIR'")
        recorded = json.loads(graphs_file.read_text())
        missing = [f for f in files if f not in recorded["graphs"]]
        if missing:
            raise NeuronPortError(f"{rank_dir / GRAPHS_FILE}: expected graphs {files}, found {sorted(recorded['graphs'])}")
        executor = load(Path(rank_dir), int(recorded["tp"]))
        return {f: ResidentKVRunner(executor, int(recorded["graphs"][f]["inputs"]), recorded["graphs"][f].get("slot_ids"))
                for f in files}


__all__ = ["GRAPHS_FILE", "DECODE_KV_WRITE", "resident_factory", "slot_ids", "write_nxd_rank", "shard_bytes", "kv_state_bytes",
           "NxdBackend"]
