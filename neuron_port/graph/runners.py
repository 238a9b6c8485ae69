"""What runs a rank's steps: its graphs as they are, or compiled by a backend, saved and loaded.

:func:`compile_graphs` is the one compile loop. ``Port.compile``, artifacts (through
``Port.compile`` in every rank) and the server's slim mode all go through it, so the KV
write mode, the example inputs and the aliases a backend sees cannot differ between them.
:func:`save_runners` and :func:`load_runners` write and read a rank's compiled graphs with
the same names and the same recorded facts (batch, the KV-write kind, the row graphs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from neuron_port.errors import NeuronPortError
from neuron_port.graph.contracts import ArtifactGraphs, GraphCompiler, GraphSaver
from neuron_port.graph.graphs import GraphSet
from neuron_port.graph.kv import KVStore, KVWrite
from neuron_port.graph.shapes import decode_rows_for, rows_for
from neuron_port.graph.step import Runnable, StepInputs
from neuron_port.progress import progress

Examples = Callable[[str, int, int, int], tuple[StepInputs, KVStore]]
"""(kind "prefill" | "decode", size, rows, store rows) -> example inputs of ``rows`` rows and a store for tracing
(of ``store rows`` rows where the graphs share one store: a graph of fewer rows takes the whole store)."""


@dataclass
class Runners:
    """Callables for every step of one rank, keyed by prompt bucket and by KV length.

    ``batch``: the rows they take (None: any, as eager graphs do). ``kv_write``: how the decode
    runners write the new K/V (:class:`~neuron_port.graph.kv.KVWrite`: a blend, in place, or the new
    rows only). ``compiled``: a backend made them (they
    no longer need the graphs or the model). ``inference_mode``: they may run under
    ``torch.inference_mode`` (XLA's lazy tensors cannot: they run under ``no_grad``). ``resident_kv``:
    the store lives on the device as the runners' own state, one for every graph (nxd, neuron); the
    host store handed in is a placeholder, returned as it is, so the host keeps one at the largest KV
    length and hands each graph a prefix view of it, never copying it between lengths. ``decode_rows``:
    decode runners over fewer rows than ``batch`` ({rows: {KV length: runner}}), so a step whose occupied
    rows fit runs the smaller graph on the first rows of the same store (:meth:`decode_step`). ``one_store``:
    every runner takes and returns the one store at the largest KV length, all of its rows (graphs built with
    ``one_store``: :func:`~neuron_port.graph.graphs.build_graphs`; a decode runner over fewer rows reads and writes
    the first of them), so nothing is viewed or copied between lengths or row counts. ``verify``: verify runners
    by token count, over the store at the largest KV length (speculative decoding; compiled ones for the whole
    batch, saved in a cpu artifact).
    """

    prefill: dict[int, Runnable]
    decode: dict[int, Runnable]
    batch: int | None = None
    kv_write: KVWrite = KVWrite.BLEND
    compiled: bool = False
    inference_mode: bool = True
    resident_kv: bool = False
    decode_rows: dict[int, dict[int, Runnable]] = field(default_factory=dict)
    one_store: bool = False
    verify: dict[int, Runnable] = field(default_factory=dict)

    def decode_step(self, needed: int, kv: int) -> tuple[int, Runnable]:
        """(rows, runner) of a decode step at KV length ``kv`` whose occupied rows are the first ``needed``:
        the smallest graph holding them (eager graphs: exactly ``needed``)."""
        rows = rows_for(needed, self.batch, list(self.decode_rows))
        table = self.decode if self.batch is None or rows == self.batch else self.decode_rows[rows]
        return rows, table[kv]

    def facts(self) -> dict[str, Any]:
        """What an artifact's manifest records about them besides its batch."""
        facts = {"kv_write": self.kv_write.value, "decode_rows": sorted(self.decode_rows)}
        return {**facts, "verify": sorted(self.verify)} if self.verify else facts


def eager_runners(graphs: GraphSet) -> Runners:
    """The graphs themselves, run eagerly (any batch, one-hot KV writes)."""
    return Runners(dict(graphs.prefill), dict(graphs.decode), one_store=graphs.one_store, verify=dict(graphs.verify))


def compile_graphs(graphs: GraphSet, backend: GraphCompiler, examples: Examples, batch: int = 1, desc: str = "compiling",
                   decode_rows: Sequence[int] = ()) -> Runners:
    """Compile every graph with ``backend.compile(graph, example inputs, aliases)``; each decode graph also
    for each of ``decode_rows`` (row counts below ``batch``: :func:`~neuron_port.graph.shapes.occupancy_rows`).

    Decode graphs write K/V the way the backend declares (``backend.kv_write``, a
    :class:`~neuron_port.graph.kv.KVWrite`); prefill graphs write their prompt rows
    with the backend's ``leading_update`` where it has one (XLA: one dynamic-update-slice). Graphs compiled by a
    static-shape backend (``backend.fixed_batch``) take exactly ``batch`` rows from then on. A backend that
    compiles nothing graph by graph (ModelBuilder's, which builds whole artifacts) is refused by name.
    """
    if not isinstance(backend, GraphCompiler):
        raise NeuronPortError(f"{type(backend).__name__} compiles no graph in process (it is no GraphCompiler): "
                              "ModelBuilder's backends (neuron, nxd) build whole artifacts, with "
                              "'neuron-port compile MODEL --backend nxd --out DIR'")
    kv_write, leading, static = KVWrite(backend.kv_write), backend.leading_update, backend.fixed_batch
    extra = list(decode_rows_for(batch, decode_rows)) if static else []
    jobs = [("prefill", b, g, batch) for b, g in graphs.prefill.items()]
    # over one store, a graph of fewer rows reads and writes that store's first rows (it takes the whole store)
    jobs += [("decode", kv, g.over_rows(r) if graphs.one_store and r != batch else g, r)
             for r in [batch, *extra] for kv, g in graphs.decode.items()]
    jobs += [("verify", s, g, batch) for s, g in graphs.verify.items()]  # speculative decoding: the whole batch
    out: dict[tuple[str, int], dict[int, Runnable]] = {("verify", batch): {}}
    for kind, size, graph, n in progress(jobs, desc=desc, unit="graph"):
        graph.kv_write = kv_write if kind != "prefill" else KVWrite.BLEND
        graph.leading_update = leading if kind == "prefill" else None
        inputs, store = examples(kind, size, n, batch)
        out.setdefault((kind, n), {})[size] = backend.compile(graph, [*inputs, *store.tensors()], graph.aliases)
    return Runners(out[("prefill", batch)], out[("decode", batch)], batch if static else None, kv_write, compiled=True,
                   inference_mode=backend.inference_mode,
                   decode_rows={r: out[("decode", r)] for r in extra}, one_store=graphs.one_store,
                   verify=out[("verify", batch)])


def runner_file(kind: str, size: int, rows: int | None = None) -> str:
    """File name of a compiled graph inside a rank's directory (``rows``: a decode graph over fewer rows
    than the artifact's batch)."""
    return f"{kind}_{size}.pt" if rows is None else f"{kind}_{size}_rows{rows}.pt"


def save_runners(runners: Runners, backend: GraphSaver, rank_dir: Path,
                 named_tensors: Mapping[str, torch.Tensor] | None = None) -> list[Path]:
    """Save every compiled runner into ``rank_dir``; returns the files written.

    The backend writes the rank's weights once for all its graphs; ``named_tensors`` ({name: tensor}, the
    rank's state and ``host:`` tables) names them. Verify graphs (speculative decoding) are saved beside the others,
    sharing the one pool of weights."""
    rank_dir.mkdir(parents=True, exist_ok=True)
    files = {runner_file(kind, size): runner for kind, table in (("prefill", runners.prefill), ("decode", runners.decode),
                                                                 ("verify", runners.verify))
             for size, runner in table.items()}
    files.update({runner_file("decode", kv, rows): runner for rows, table in runners.decode_rows.items()
                  for kv, runner in table.items()})
    return backend.save_graphs(files, rank_dir, dict(named_tensors or {}))


def load_runners(backend: ArtifactGraphs, rank_dir: Path, buckets: list[int], kv_lens: list[int], batch: int,
                 facts: dict[str, Any], host: Mapping[str, torch.Tensor] | None = None) -> Runners:
    """The runners :func:`save_runners` wrote, compiled for ``batch`` rows, with the facts the
    manifest recorded; ``host``: the host tables a graph may read (``host:`` tensors)."""
    decode_rows = [int(r) for r in facts.get("decode_rows", [])]
    files = [runner_file("prefill", b) for b in buckets] + [runner_file("decode", kv) for kv in kv_lens]
    files += [runner_file("decode", kv, rows) for rows in decode_rows for kv in kv_lens]
    verify_tokens = [int(s) for s in facts.get("verify", [])]
    files += [runner_file("verify", s) for s in verify_tokens]
    loaded = backend.load_graphs(rank_dir, files, dict(host or {}))
    prefill = {b: loaded[runner_file("prefill", b)] for b in buckets}
    decode = {kv: loaded[runner_file("decode", kv)] for kv in kv_lens}
    by_rows = {rows: {kv: loaded[runner_file("decode", kv, rows)] for kv in kv_lens} for rows in decode_rows}
    return Runners(prefill, decode, int(batch), KVWrite(facts["kv_write"]), compiled=True,
                   resident_kv=bool(facts.get("resident_kv", False)), decode_rows=by_rows,
                   verify={s: loaded[runner_file("verify", s)] for s in verify_tokens})


__all__ = ["Runners", "Examples", "eager_runners", "compile_graphs", "runner_file", "save_runners", "load_runners"]
