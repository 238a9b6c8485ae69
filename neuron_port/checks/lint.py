"""Static checks of the exported graphs for what the Neuron compiler handles badly.

The graphs of the tiny variant are traced on the CPU (TorchScript, the same export the CPU
backend saves) and every op is inspected:

* ``scatter`` / ``index_put`` / ``nonzero`` / ``masked_select`` / ``unique``: data-dependent
  indexing or shapes — write caches as one-hot blends instead. One exception: an out-of-place
  ``scatter`` along the sequence into a KV store input, whose result the graph returns, is that
  store written back by rows, the decode write
  NxD Inference itself uses into its aliased cache (and the one the neuron and nxd backends'
  decode graphs use, :data:`~neuron_port.backends.nxd_artifact.DECODE_KV_WRITE`): reported as
  ``kv-row-write`` (info), not as an error;
* ``embedding`` over the vocabulary: the table belongs on the host;
* any elementwise op whose output spans the vocabulary (found on the tiny graph by the tiny
  vocab size) — its SBUF working set is computed with the *real* config's vocabulary.

SBUF formula (documented assumption). A NeuronCore's SBUF is 128 partitions x 196,608 B. An
elementwise op over ``[rows, V]`` is laid out with rows across partitions and the whole
vocabulary row along each partition's free dimension, so one partition must hold
``ceil(rows / 128) x V x bytes(dtype)``. With Gemma's V = 262,144 in bf16 that is
262,144 x 2 = 524,288 B per partition against 196,608 — the field report's ``NCC_INLA001``
figure (the compiler's own message: ``(128x524288) 524288 vs 196608 B/partition``).

Attention: the tiled eager formulation keeps one fp32 score row per partition,
``window x 4`` B; the fused attention custom-call is flagged from an empirical threshold (the
field report saw it overflow SBUF at window 1024 and fit at 512), since its internal tiling is
not public.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn

from neuron_port.backends.nxd_artifact import DECODE_KV_WRITE
from neuron_port.checks.check import Check
from neuron_port.errors import AdapterError
from neuron_port.generation.logits import softcap
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config
from neuron_port.model.layout import Layout, describe
from neuron_port.model.loading import build_model

SBUF_PARTITIONS = 128
SBUF_BYTES_PER_PARTITION = 196_608
FUSED_ATTENTION_WINDOW_LIMIT = 1024  # empirical (field report): 512 fits, 1024 overflows

HOSTILE_OPS = {
    "aten::scatter": "scatter: data-dependent writes; use a one-hot blend (neuron_port.graph.kv.onehot_write), or write "
                     "a KV store input back by rows and return it (neuron_port.graph.kv.row_write)",
    "aten::scatter_": "scatter: data-dependent writes; use a one-hot blend (neuron_port.graph.kv.onehot_write)",
    "aten::index_put": "index_put: data-dependent writes; use a one-hot blend",
    "aten::index_put_": "index_put: data-dependent writes; use a one-hot blend",
    "aten::nonzero": "nonzero: data-dependent output shape; use static masks",
    "aten::masked_select": "masked_select: data-dependent output shape; use static masks",
    "aten::unique": "unique: data-dependent output shape",
    "aten::embedding": "embedding lookup on the device: gather on the host and feed activations (embedding.HostEmbeddings)",
}
ELEMENTWISE = {"aten::tanh", "aten::div", "aten::mul", "aten::exp", "aten::sigmoid", "aten::softmax", "aten::log_softmax"}


class _SoftcapInGraph(nn.Module):
    """The decode graph with the final softcap moved back onto the device (what not to do)."""

    def __init__(self, graph: nn.Module, cap: float):
        super().__init__()
        self.graph = graph
        self.cap = cap

    def forward(self, *inputs: torch.Tensor):
        out = self.graph(*inputs)
        return (softcap(out[0], self.cap), *out[1:])


def sbuf_bytes_per_partition(rows: int, width: int, dtype_bytes: int) -> int:
    """Bytes one SBUF partition holds for an elementwise op over ``[rows, width]`` (see module doc)."""
    return math.ceil(rows / SBUF_PARTITIONS) * width * dtype_bytes


def _trace(graph: nn.Module, inputs: list[torch.Tensor]) -> torch.jit.ScriptModule:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(graph, tuple(inputs), check_trace=False, strict=False)


_SHAPE_ROOTS = {"prim::NumToTensor", "prim::Constant", "aten::size", "prim::ListConstruct"}
_SHAPE_ARITHMETIC = {"aten::floor_divide", "aten::mul", "aten::add", "aten::sub", "aten::div", "aten::remainder",
                     "aten::Int", "aten::ScalarImplicit", "aten::to", "aten::floordiv", "aten::__floordiv__"}


def _shape_derived(value, memo: dict) -> bool:
    """True when a traced value is computed only from tensor shapes and constants."""
    key = value.debugName()
    if key in memo:
        return memo[key]
    node = value.node()
    kind = node.kind()
    if kind in _SHAPE_ROOTS:
        result = True
    elif kind in _SHAPE_ARITHMETIC:
        result = all(_shape_derived(v, memo) for v in node.inputs())
    else:
        result = False  # a graph input or a value computed from one
    memo[key] = result
    return result


_PACK = {"prim::TupleConstruct", "prim::ListConstruct"}
_UNPACK = {"prim::TupleUnpack", "prim::ListUnpack"}


def _unpacked_source(value):
    """The value a traced value is, through tuple and list packing: an item unpacked from a tuple
    built in the graph is that tuple's item."""
    while value.node().kind() in _UNPACK:
        node = value.node()
        packed = next(iter(node.inputs())).node()
        if packed.kind() not in _PACK:
            break
        value = list(packed.inputs())[list(node.outputs()).index(value)]
    return value


def _returned_values(graph) -> set[str]:
    """Debug names of the values a traced graph returns: a returned tuple's items, each followed back
    through the packing and unpacking the trace keeps (Hugging Face's caches hand K/V around in tuples)."""
    names = set()
    for out in graph.outputs():
        producer = out.node()
        items = producer.inputs() if producer.kind() in _PACK else [out]
        names.update(_unpacked_source(v).debugName() for v in items)
    return names


def _is_kv_row_write(node, kv_inputs: set[str], returned: set[str]) -> bool:
    """An out-of-place ``scatter`` along the sequence (dim 2 of ``[batch, heads, slots, head_dim]``) into a
    KV store the graph takes as an input, whose result the graph returns: the store written back by rows."""
    if node.kind() != "aten::scatter":
        return False
    target, dim = list(node.inputs())[:2]
    dim_node = dim.node()
    along_sequence = dim_node.kind() == "prim::Constant" and dim_node.i("value") == 2
    return (along_sequence and _unpacked_source(target).debugName() in kv_inputs
            and all(out.debugName() in returned for out in node.outputs()))


def _scan(traced: torch.jit.ScriptModule, name: str, tiny_vocab: int, real: Layout, dtype_bytes: int,
          kv_count: int = 0) -> list[Check]:
    """Findings on a traced graph whose last ``kv_count`` inputs are its KV store."""
    findings = []
    graph = traced.inlined_graph
    returned = _returned_values(graph)
    inputs = list(graph.inputs())
    kv_inputs = {v.debugName() for v in inputs[len(inputs) - kv_count:]} if kv_count else set()
    row_writes = 0
    for node in graph.nodes():
        kind = node.kind()
        row_write = _is_kv_row_write(node, kv_inputs, returned)
        row_writes += row_write  # a KV store written back by rows: NxD Inference's decode write (module doc)
        if kind in ("aten::Int", "aten::item", "aten::Float", "aten::Bool"):
            source = next(iter(node.inputs()))
            producer = source.node().kind()
            if not _shape_derived(source, {}):
                findings.append(
                    Check.finding(
                        "value-baked-into-trace",
                        "error",
                        f"{name}: {kind} of {producer}",
                        "a tensor's value becomes a Python number: the trace freezes the example's value (a position, an index)",
                        "pass positions as tensors and select with one-hot arithmetic "
                        "(neuron_port.graph.masks, neuron_port.graph.kv.onehot_write)",
                    )
                )
        if kind in HOSTILE_OPS and not row_write:
            findings.append(
                Check.finding(
                    "neuron-hostile-op",
                    "error",
                    f"{name}: {kind}",
                    HOSTILE_OPS[kind].split(":")[0],
                    HOSTILE_OPS[kind].split(": ", 1)[-1],
                )
            )
        if kind in ELEMENTWISE:
            for out in node.outputs():
                sizes = out.type().sizes() if hasattr(out.type(), "sizes") else None
                if sizes and sizes[-1] == tiny_vocab:
                    rows = int(math.prod(sizes[:-1]))
                    need = sbuf_bytes_per_partition(rows, real.vocab_size, dtype_bytes)
                    if need > SBUF_BYTES_PER_PARTITION:
                        findings.append(
                            Check.finding(
                                "sbuf-overflow-vocab-elementwise",
                                "error",
                                f"{name}: {kind} over [rows={rows}, vocab]",
                                f"{need:,} B per SBUF partition (ceil({rows}/128) x {real.vocab_size:,} x {dtype_bytes} B) "
                                f"against {SBUF_BYTES_PER_PARTITION:,}",
                                "move the op to the host: end the graph at raw logits and apply the softcap only where "
                                "sampling needs it (argmax is softcap-invariant)",
                            )
                        )
    if row_writes:
        findings.append(Check.finding("kv-row-write", "info", f"{name}: {row_writes} aten::scatter",
                                      "KV stores written back by rows (a scatter the graph returns into its aliased "
                                      "store), as NxD Inference's decode writes its cache", "none needed"))
    return findings


def _graph_findings(tiny_config, real: Layout, softcap_in_graph: bool, dtype_bytes: int) -> tuple[list[str], list[Check]]:
    """(names of the graphs traced, findings on them): the tiny variant's prefill and decode graphs."""
    model = build_model(tiny_config, seed=0)
    tiny = describe(model)
    port = Port.over_model(model, PortShape(16, 32), tiny, owned=True)  # built here for this port alone
    examples = (port.inputs.example_prefill(16), port.inputs.example_decode(32))
    flat = [[*inputs, *store] for inputs, store in examples]
    kv_count = len(examples[1][1].tensors())
    port.graphs.decode[32].kv_write = DECODE_KV_WRITE  # decode as the neuron and nxd backends trace it
    graphs = {"prefill_16": (port.graphs.prefill[16], flat[0]), "decode_32": (port.graphs.decode[32], flat[1])}
    if softcap_in_graph:
        graphs = {k: (_SoftcapInGraph(g, tiny.softcap or 30.0), x) for k, (g, x) in graphs.items()}
    findings: list[Check] = []
    for gname, (graph, inputs) in graphs.items():
        findings += _scan(_trace(graph, inputs), gname, tiny.vocab_size, real, dtype_bytes, kv_count)
    return list(graphs), findings


def lint_model(name: str, softcap_in_graph: bool = False, dtype_bytes: int = 2) -> dict[str, Any]:
    """Trace the tiny variant's graphs and report findings at the real config's dimensions.

    A family without a tiny variant gets the findings that need no graph, and one saying the
    graphs were not traced and which adapter hook would let them be."""
    real = describe(load_config(name))
    try:
        tiny_config = load_config(name, tiny=True)
    except AdapterError as exc:
        traced: list[str] = []
        findings = [
            Check.finding(
                "graphs-not-traced",
                "warning",
                f"{real.model_type}: no tiny variant",
                str(exc),
                "give the adapter a tiny variant (tiny_heads, or tiny_config_dict) to lint its graphs",
            )
        ]
    else:
        traced, findings = _graph_findings(tiny_config, real, softcap_in_graph, dtype_bytes)
    windows = sorted({s.window for s in real.layers if s.window})
    for w in windows:
        tiled = w * 4
        findings.append(
            Check.finding(
                "attention-working-set",
                "info",
                f"sliding window {w}",
                f"tiled (eager) attention keeps one fp32 score row per partition: {tiled:,} B of {SBUF_BYTES_PER_PARTITION:,}",
                "the graphs use the library's eager attention (no fused custom-call)",
            )
        )
        if w >= FUSED_ATTENTION_WINDOW_LIMIT:
            findings.append(
                Check.finding(
                    "fused-attention-window",
                    "warning",
                    f"sliding window {w}",
                    f"the fused attention custom-call overflowed SBUF at window {FUSED_ATTENTION_WINDOW_LIMIT} "
                    "in the field report",
                    "keep attention eager/tiled (neuron_port.model.loading.force_eager on the config)",
                )
            )
    return {
        "model": name,
        "softcap_in_graph": softcap_in_graph,
        "dtype_bytes": dtype_bytes,
        "sbuf_bytes_per_partition": SBUF_BYTES_PER_PARTITION,
        "graphs_traced": traced,
        "findings": [f.to_finding() for f in findings],
        "errors": sum(f.failed for f in findings),
    }


__all__ = ["lint_model", "sbuf_bytes_per_partition", "SBUF_BYTES_PER_PARTITION", "HOSTILE_OPS"]
