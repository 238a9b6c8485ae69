"""The CPU backend's static-shape TorchScript passes: what each rewrites, that values survive
(bit for bit where promised), that saved graphs keep the rewrite, and the batch guard that makes
folding shapes safe."""


from __future__ import annotations

import io
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from neuron_port import describe
from neuron_port.backends import get_backend
from neuron_port.backends.static_graph_passes import (
    drop_noop_casts,
    fold_static_sizes,
    node_count,
    optimize_traced,
    pretranspose_wide_linears,
    swap_few_row_transposed_products,
)
from neuron_port.errors import BucketError
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape


class _Block(nn.Module):
    """Shape arithmetic, no-op casts, a wide and a narrow projection, a biased one and a weight
    that is also read outside a linear: every case the passes distinguish."""

    def __init__(self, hidden: int = 16, heads: int = 4, head_dim: int = 8):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.wide = nn.Linear(hidden, heads * head_dim, bias=False)  # out 32 > in 16: pre-transposed
        self.narrow = nn.Linear(heads * head_dim, hidden, bias=False)  # out 16 < in 32: kept
        self.biased = nn.Linear(hidden, 4 * hidden)  # wide, but with a bias: kept
        self.shared = nn.Linear(hidden, 2 * hidden, bias=False)  # wide, its weight also read by a matmul below

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wide(x.float()).view(b, s, x.shape[-1] // 4, -1).transpose(1, 2).contiguous()
        q = q.reshape(b, s, -1).type_as(x)
        y = self.narrow(q) + self.biased(x)[..., : x.shape[-1]]
        return y + self.shared(x)[..., : x.shape[-1]] + torch.matmul(self.wide(x), self.shared.weight)


def _trace(module: nn.Module, *examples: torch.Tensor) -> torch.jit.ScriptModule:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        return torch.jit.trace(module.eval(), examples, check_trace=False)


def _kinds(graph) -> list[str]:
    return [n.kind() for n in graph.nodes()]


def test_sizes_and_casts_fold_bit_for_bit():
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(2, 5, 16)
    traced = _trace(block, x)
    graph = traced.graph
    torch._C._jit_pass_inline(graph)
    assert "aten::size" in _kinds(graph)
    before = node_count(graph)
    assert fold_static_sizes(graph) >= 3
    assert drop_noop_casts(graph) >= 2  # x.float() and type_as(x) on a float32 x
    kinds = _kinds(graph)
    assert "aten::size" not in kinds and "prim::NumToTensor" not in kinds
    assert "aten::type_as" not in kinds and "aten::to" not in kinds
    assert "aten::contiguous" in kinds  # the transposed view really is copied: that one stays
    assert node_count(graph) < before
    with torch.no_grad():
        assert torch.equal(traced(x), block(x))


def test_wide_linears_are_pretransposed_and_values_agree():
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(2, 5, 16)
    frozen, counts = optimize_traced(_trace(block, x))
    assert counts["linears_pretransposed"] == 1  # only `wide`: narrow, biased and shared keep linear
    linears = [n for n in frozen.graph.nodes() if n.kind() == "aten::linear"]
    assert sorted(tuple(n.inputsAt(1).toIValue().shape) for n in linears) == [(16, 32), (32, 16), (64, 16)]
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), block(x), rtol=1e-5, atol=1e-5)
    buffer = io.BytesIO()
    torch.jit.save(frozen, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    kinds = _kinds(loaded.graph)
    assert "aten::size" not in kinds and kinds.count("aten::linear") == 3
    with torch.no_grad():
        assert torch.equal(loaded(x), frozen(x))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(out_features=st.integers(1, 48), in_features=st.integers(1, 48), rows=st.integers(1, 3))
def test_pretranspose_rule(out_features, in_features, rows):
    torch.manual_seed(out_features * 100 + in_features)
    linear = nn.Linear(in_features, out_features, bias=False)
    x = torch.randn(1, rows, in_features)
    frozen = torch.jit.freeze(_trace(linear, x))
    rewritten = pretranspose_wide_linears(frozen.graph)
    assert rewritten == int(out_features > in_features)
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), linear(x), rtol=1e-5, atol=1e-5)


class _Scores(nn.Module):
    """A query group [b, h, m, d] against keys [b, h, n, d]: attention's score product."""

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return torch.matmul(query, keys.transpose(2, 3)).view(query.shape[0], -1)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(rows=st.integers(1, 24), slots=st.integers(1, 40), dim=st.integers(1, 16))
def test_few_row_products_swap_sides(rows, slots, dim):
    torch.manual_seed(rows * 1000 + slots)
    query, keys = torch.randn(1, 2, rows, dim), torch.randn(1, 2, slots, dim)
    traced = _trace(_Scores(), query, keys)
    graph = traced.graph
    torch._C._jit_pass_inline(graph)
    fold_static_sizes(graph)
    swapped = swap_few_row_transposed_products(graph)
    assert swapped == int(rows <= 16 < slots)  # few query rows, many key rows
    with torch.no_grad():
        torch.testing.assert_close(traced(query, keys), _Scores()(query, keys), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def e2b_ports(tiny_e2b):
    layout = describe(tiny_e2b)
    ports, backends = {}, {}
    for name, options in (("passes", {}), ("traced", {"passes": False})):
        backends[name] = get_backend("cpu", **options)
        ports[name] = Port.over_model(tiny_e2b, PortShape([32], [64]), layout)
        ports[name].compile(backends[name])
    return tiny_e2b, ports, backends


def test_port_with_passes_matches_the_eager_port_and_the_plain_trace(e2b_ports):
    model, ports, backends = e2b_ports
    assert backends["passes"].pass_counts["sizes_folded"] > 0 and backends["traced"].pass_counts == {}
    assert node_count(ports["passes"].runners.decode[64].graph) < node_count(ports["traced"].runners.decode[64].graph)
    prompt = [2] + list(range(30, 50))
    eager = generate(Port.over_model(model, PortShape([32], [64])), GenerationRequest.greedy([prompt], 20, keep_logits=True))
    passes = generate(ports["passes"], GenerationRequest.greedy([prompt], 20, keep_logits=True))
    traced = generate(ports["traced"], GenerationRequest.greedy([prompt], 20, keep_logits=True))
    assert passes.tokens == eager.tokens == traced.tokens
    assert len(passes.step_logits) == len(traced.step_logits) > 0
    for a, b in zip(passes.step_logits, traced.step_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _matrix_constants(runner) -> set[int]:
    """The weight matrices a graph reads (its slot indices, int64 aranges the graph's masks compare
    positions with, are its own)."""
    values = (n.output().toIValue() for n in runner.graph.nodes() if n.kind() == "prim::Constant")
    return {v.data_ptr() for v in values if isinstance(v, torch.Tensor) and v.dim() == 2 and v.dtype != torch.int64}


def test_graphs_of_one_port_share_each_transposed_weight(e2b_ports):
    _, ports, backends = e2b_ports
    port = ports["passes"]
    prefill, decode = _matrix_constants(port.runners.prefill[32]), _matrix_constants(port.runners.decode[64])
    transposed = {copy.data_ptr() for _, copy in backends["passes"]._transposed.values()}
    assert transposed and transposed <= prefill and transposed <= decode
    assert prefill == decode  # every weight matrix is one tensor both graphs read


def test_compiled_port_takes_only_its_batch(e2b_ports):
    model, ports, _ = e2b_ports
    port = ports["passes"]
    assert port.batch == 1
    with pytest.raises(BucketError, match="compiled graphs take batch 1, found 2 prompts"):
        generate(port, GenerationRequest.greedy([[2, 5, 6], [2, 7]], 4))
    eager = Port.over_model(model, PortShape([32], [64]))
    assert eager.batch is None and len(generate(eager, GenerationRequest.greedy([[2, 5, 6], [2, 7]], 4)).tokens) == 2
    eager.compile(get_backend("cpu-eager"))
    assert eager.batch is None
