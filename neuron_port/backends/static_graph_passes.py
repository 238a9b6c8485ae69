"""TorchScript graph passes that use what the port's graphs promise: fixed shapes.

A traced graph keeps computing every size at run time: ``aten::size`` feeds int arithmetic
(``floor_divide``, ``NumToTensor``, ``Int``) that feeds ``view`` / ``reshape`` / ``expand``
shapes. It also keeps casts to a dtype a value already has (``to``, ``type_as``) and
``contiguous`` calls on contiguous values. On a CPU each such node costs the interpreter about
a microsecond or more, and a mid-size decode step has thousands of them. The port only ever
runs a graph with the shapes it was traced with (a prompt bucket or a KV length, and the
compiled batch: :attr:`neuron_port.graph.port.Port.batch` refuses any other), so those sizes are
constants.

Two more rewrites serve the products of a decode step, where MKL leaves the second core idle
or reads weights slowly (measured on this project's 2-core AMD EPYC; see ``benchmarks/README.md``):

* a one-row activation times a weight stored ``[out, in]`` (``linear``, an ``NT`` product) reads
  the weight at about half the rate of the same product against the weight stored ``[in, out]``
  when ``out > in``; frozen weights are constants, so the transposed copy is made once;
* a query group of 8 rows times the transposed keys runs on one core, while the keys times the
  transposed query group (the same dot products) is split over both.

Passes, in order (:func:`optimize_traced` runs them all):

1. :func:`fold_static_sizes` on the traced graph: sizes of fully typed values become constants,
   then constant propagation folds the arithmetic built on them;
2. :func:`drop_noop_casts`: casts and ``contiguous`` calls whose input already has the output's
   dtype, sizes and strides return their input, so uses of the output read the input;
3. :func:`swap_few_row_transposed_products`;
4. ``torch.jit.freeze`` (weights become constants);
5. :func:`pretranspose_wide_linears` on the frozen graph.

Passes 1 and 2 change no value (bit-identical outputs). Passes 3 and 5 change the order in which
MKL sums a dot product, so outputs agree to float rounding, not bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

Graph = Any  # torch._C.Graph (no public type)


def _complete_sizes(value) -> list[int] | None:
    """The traced sizes of a tensor value when every one is known, else None."""
    kind = value.type()
    if not isinstance(kind, torch._C.TensorType):
        return None
    sizes = kind.sizes()
    if sizes is None or any(s is None for s in sizes):
        return None
    return [int(s) for s in sizes]


# Ops whose output shape depends on input values: a graph holding one keeps all its sizes.
DATA_DEPENDENT_SHAPES = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2", "aten::unique_consecutive",
                         "aten::unique_dim", "aten::nonzero_static", "aten::repeat_interleave")


def _replace(node, value) -> None:
    """Point every use of ``node``'s output at ``value`` and delete ``node``."""
    node.output().replaceAllUsesWith(value)
    node.destroy()


def fold_static_sizes(graph: Graph) -> int:
    """Replace ``aten::size(x, dim)`` and ``aten::size(x)`` by constants where ``x`` has complete
    traced sizes, then propagate constants and drop dead nodes. Returns how many were folded
    (none in a graph with an op of :data:`DATA_DEPENDENT_SHAPES`)."""
    if any(graph.findAllNodes(kind) for kind in DATA_DEPENDENT_SHAPES):
        return 0  # a size downstream of these depends on the values, not only on the input shapes
    folded = 0
    for node in graph.findAllNodes("aten::size"):
        inputs = list(node.inputs())
        sizes = _complete_sizes(inputs[0])
        if sizes is None:
            continue
        if len(inputs) == 1:
            value: int | list[int] = sizes
        else:
            dim = inputs[1].toIValue()
            if not isinstance(dim, int):
                continue
            value = sizes[dim]
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(value)
        _replace(node, constant)
        folded += 1
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)
    return folded


def _same_layout(a, b) -> bool:
    ta, tb = a.type(), b.type()
    if not (isinstance(ta, torch._C.TensorType) and isinstance(tb, torch._C.TensorType)):
        return False
    return (ta.scalarType() is not None and ta.scalarType() == tb.scalarType() and ta.sizes() == tb.sizes()
            and ta.strides() is not None and ta.strides() == tb.strides())


def _noop_source(node):
    """The input a cast-like node returns unchanged, or None when it may copy or convert."""
    inputs = list(node.inputs())
    out = node.output()
    kind = node.kind()
    if kind == "aten::to" and len(inputs) == 5:  # to(self, dtype, non_blocking, copy, memory_format)
        if inputs[3].toIValue() is False and inputs[4].toIValue() is None and _same_layout(inputs[0], out):
            return inputs[0]
    elif kind == "aten::type_as" and _same_layout(inputs[0], out):
        return inputs[0]
    elif kind == "aten::contiguous" and _same_layout(inputs[0], out):
        return inputs[0]
    return None


def drop_noop_casts(graph: Graph) -> int:
    """Bypass ``to`` (dtype form, ``copy=False``), ``type_as`` and ``contiguous`` nodes whose
    input already has the output's dtype, sizes and strides (each returns its input itself).
    Returns how many were dropped."""
    dropped = 0
    for kind in ("aten::to", "aten::type_as", "aten::contiguous"):
        for node in graph.findAllNodes(kind):
            if node.outputsSize() != 1:
                continue
            source = _noop_source(node)
            if source is None:
                continue
            _replace(node, source)
            dropped += 1
    return dropped


# {(data_ptr, shape, stride, dtype): (the weight, its transposed copy)}. Holding the weight keeps
# its address from being reused by another tensor while the entry exists.
TransposedCache = dict


def _transposed(weight: torch.Tensor, cache: TransposedCache | None) -> torch.Tensor:
    """``weight.t().contiguous()``, shared through ``cache`` by every graph frozen from the same
    parameter (one prefill graph per bucket and one decode graph per KV length read the same
    weights: without sharing, each would hold its own transposed copy). A frozen graph's
    constant is a new Python object on every read, so the cache matches on the memory it views."""
    if cache is None:
        return weight.t().contiguous()
    key = (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)
    hit = cache.get(key)
    if hit is not None:
        return hit[1]
    copy = weight.t().contiguous()
    cache[key] = (weight, copy)
    return copy


def pretranspose_wide_linears(graph: Graph, cache: TransposedCache | None = None) -> int:
    """``aten::linear(x, W, None)`` with a constant ``W`` [out, in], ``out > in``, becomes
    ``aten::matmul(x, W_t)`` with the constant ``W_t = W.t().contiguous()`` [in, out].

    Linears with a bias keep their form, and so does a weight that anything besides such
    linears reads (no second copy of it is kept). ``cache`` (an empty dict to start, then passed
    to every graph of one model) makes graphs frozen from the same parameters share each
    transposed copy. Returns how many linears were rewritten."""
    by_weight: dict[int, list] = {}
    for node in graph.findAllNodes("aten::linear"):
        x, weight, bias = list(node.inputs())
        w = weight.toIValue()
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] <= w.shape[1] or bias.toIValue() is not None:
            continue
        by_weight.setdefault(weight.unique(), []).append(node)
    rewritten = 0
    for nodes in by_weight.values():
        weight = nodes[0].inputsAt(1)
        if len(weight.uses()) != len(nodes):
            continue
        with graph.insert_point_guard(weight.node()):
            transposed = graph.insertConstant(_transposed(weight.toIValue(), cache))
        for node in nodes:
            with graph.insert_point_guard(node):
                product = graph.insertNode(graph.create("aten::matmul", [node.inputsAt(0), transposed]))
            product.output().setType(node.output().type())
            _replace(node, product.output())
            rewritten += 1
    torch._C._jit_pass_dce(graph)
    return rewritten


FEW_ROWS = 16


def swap_few_row_transposed_products(graph: Graph, few_rows: int = FEW_ROWS) -> int:
    """``matmul(A, transpose(K, -2, -1))`` with ``A`` [..., m, d], ``m <= few_rows``, and ``K``
    [..., n, d], ``n > m``, becomes ``transpose(matmul(K, transpose(A, -2, -1)), -2, -1)``
    made contiguous: the same dot products, with the many rows on the side MKL splits over
    threads (the query-key product of a decode step: m is a KV head's query group, n its slots).

    Needs complete traced sizes on ``A`` and ``K``. Returns how many products were swapped."""
    swapped = 0
    for node in graph.findAllNodes("aten::matmul"):
        a, b = list(node.inputs())
        producer = b.node()
        if producer.kind() != "aten::transpose":
            continue
        k = producer.inputsAt(0)
        sa, sk = _complete_sizes(a), _complete_sizes(k)
        if sa is None or sk is None or len(sa) < 2 or len(sa) != len(sk):
            continue
        dims = [d.toIValue() for d in list(producer.inputs())[1:]]
        if not all(isinstance(d, int) for d in dims) or sorted(d % len(sk) for d in dims) != [len(sk) - 2, len(sk) - 1]:
            continue
        if not sa[-2] <= few_rows < sk[-2]:
            continue
        with graph.insert_point_guard(node):
            minus1, minus2 = graph.insertConstant(-1), graph.insertConstant(-2)
            a_t = graph.insertNode(graph.create("aten::transpose", [a, minus2, minus1]))
            product = graph.insertNode(graph.create("aten::matmul", [k, a_t.output()]))
            back = graph.insertNode(graph.create("aten::transpose", [product.output(), minus2, minus1]))
            dense = graph.insertNode(graph.create("aten::contiguous", [back.output(), graph.insertConstant(0)]))
        dense.output().setType(node.output().type())
        _replace(node, dense.output())
        swapped += 1
    torch._C._jit_pass_dce(graph)
    return swapped


def optimize_traced(traced: torch.jit.ScriptModule, cache: TransposedCache | None = None
                    ) -> tuple[torch.jit.ScriptModule, dict[str, int]]:
    """Run every pass on a traced module (inlined first) and freeze it; ``cache``: see
    :func:`pretranspose_wide_linears`.

    Returns (frozen module, {pass name: nodes changed}). Call the result only with the traced
    shapes."""
    graph = traced.graph
    torch._C._jit_pass_inline(graph)
    counts = {"sizes_folded": fold_static_sizes(graph), "casts_dropped": drop_noop_casts(graph),
              "products_swapped": swap_few_row_transposed_products(graph)}
    frozen = torch.jit.freeze(traced.eval())
    counts["linears_pretransposed"] = pretranspose_wide_linears(frozen.graph, cache)
    return frozen, counts


def node_count(graph: Graph) -> int:
    """Nodes in a graph, nested blocks included."""
    return sum(1 + sum(node_count(block) for block in node.blocks()) for node in graph.nodes())


__all__ = ["fold_static_sizes", "drop_noop_casts", "swap_few_row_transposed_products", "pretranspose_wide_linears",
           "optimize_traced", "node_count", "FEW_ROWS"]
