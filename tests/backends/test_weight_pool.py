"""One copy of the weights per artifact rank: lifted graphs, the pool, and what an artifact weighs.

The oracle for sizes is Hugging Face's own ``save_pretrained`` of the same model (its
safetensors bytes); for values, the frozen graph the lifted one came from.
"""


from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from neuron_port.backends.weight_pool import POOL_FILE, WeightPool, lift_constants
from tests.helpers import load_rank0_port, run_cli

BUCKETS = "16,32,64,128"


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.up = nn.Linear(16, 48, bias=False)
        self.down = nn.Linear(48, 16, bias=False)
        self.register_buffer("scale", torch.tensor(1.5))

    def forward(self, x, kv):
        kv[:, 0] = x[:, 0]
        h = self.down(torch.relu(self.up(x))) * self.scale
        return h @ self.embed.weight.t(), kv


def _frozen(module, *inputs):
    return torch.jit.freeze(torch.jit.trace(module.eval(), inputs, check_trace=False))


def test_lifted_graph_computes_what_the_frozen_one_did():
    torch.manual_seed(0)
    module, x, kv = _Tied(), torch.randn(3, 16), torch.zeros(3, 16)
    frozen = _frozen(module, x, kv)
    function, tensors = lift_constants(frozen, min_bytes=0)
    assert len(tensors) >= 3 and not any(n.kind() == "prim::GetAttr" for n in function.graph.nodes())
    got, want = function(x, kv.clone(), *tensors)[0], frozen(x, kv.clone())[0]
    assert torch.equal(got, want)
    # a wrong binding (tensors swapped) is caught by the same comparison
    swapped = [tensors[1], tensors[0], *tensors[2:]] if tensors[0].shape == tensors[1].shape else None
    if swapped is not None:
        assert not torch.equal(function(x, kv.clone(), *swapped)[0], want)


def test_lift_refuses_a_graph_that_is_not_frozen():
    traced = torch.jit.trace(_Tied().eval(), (torch.randn(2, 16), torch.zeros(2, 16)), check_trace=False)
    with pytest.raises(ValueError, match="needs a frozen graph"):
        lift_constants(traced)


def test_pool_stores_each_tensor_once_and_names_views_and_host_tables():
    word = torch.randn(64, 16)
    up = torch.randn(48, 16)
    pool = WeightPool({"host:word": word, "up.weight": up}, transposed={})
    assert pool.add(up) == "up.weight" and pool.add(up.detach()) == "up.weight"
    assert pool.add(up.clone()) == "up.weight"  # same values, other memory: found by content
    assert pool.add(word) == "host:word" and "host:word" not in pool.tensors
    view = pool.add(word.t())
    assert view == {"view_of": "host:word", "shape": [16, 64], "stride": [1, 16], "offset": 0}
    other = pool.add(torch.randn(5, 5))
    assert other.startswith("constant.") and set(pool.tensors) == {"up.weight", other}


def _hf_weights_bytes(model, tmp_path: Path) -> int:
    out = tmp_path / "hf"
    model.save_pretrained(out)
    return sum(p.stat().st_size for p in out.glob("*.safetensors"))


def _artifact_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_artifact_holds_the_weights_once_whatever_the_bucket_count(tiny_e2b, tmp_path):
    weights = _hf_weights_bytes(tiny_e2b, tmp_path)
    art = tmp_path / "art"
    res = run_cli("compile", "gemma-4-e2b", "--tiny", "--buckets", BUCKETS, "--kv-lens", "256", "--out", str(art))
    assert res.returncode == 0, res.stderr
    total = _artifact_bytes(art)
    assert total <= 1.15 * weights, (total, weights)
    index = json.loads((art / "rank0" / "graph_weights.json").read_text())
    assert len(index) == 5
    # every graph file is code and small constants: no graph carries a weight matrix
    biggest = max(int(t.numel() * t.element_size()) for t in tiny_e2b.state_dict().values())
    for file in index:
        assert (art / "rank0" / file).stat().st_size < biggest * 2, file
    # the oracle fails the old layout: five frozen graphs, each saved with its constants
    from neuron_port.backends import get_backend
    from neuron_port.graph.port import Port
    from neuron_port.graph.shapes import PortShape

    port = Port.over_model(tiny_e2b, PortShape([16, 32, 64, 128], [256]))
    port.compile(get_backend("cpu"))
    old = tmp_path / "old"
    old.mkdir()
    for kind, table in (("prefill", port.runners.prefill), ("decode", port.runners.decode)):
        for size, runner in table.items():
            torch.jit.save(runner, str(old / f"{kind}_{size}.pt"))
    assert _artifact_bytes(old) > 1.15 * weights


def test_loaded_graphs_share_one_copy_of_the_weights(tmp_path):
    art = tmp_path / "art"
    res = run_cli("compile", "gemma-4-e2b", "--tiny", "--buckets", "16,32", "--kv-lens", "64", "--out", str(art))
    assert res.returncode == 0, res.stderr
    port = load_rank0_port(art)
    runners = [*port.runners.prefill.values(), *port.runners.decode.values()]
    pointers = [{t.data_ptr() for t in r.tensors} for r in runners]
    assert len(runners) == 3 and pointers[0] == pointers[1]
    assert len(pointers[0] & pointers[2]) >= 0.9 * len(pointers[2])  # decode reads the same tensors (plus its own few)
    # the tied head reads the host's word table: no second copy of it in the pool
    pool = json.loads((art / "rank0" / "graph_weights.json").read_text())
    assert any(isinstance(e, dict) and e["view_of"] == "host:word" or e == "host:word" or e == "host:word.T"
               for entries in pool.values() for e in entries)
    word_shape = list(port.inputs.embeddings.word.shape)
    from neuron_port.model.tensorfile import read_header

    header = read_header(art / "rank0" / POOL_FILE)[0]
    assert not any(sorted(v.get("shape", [])) == sorted(word_shape) for k, v in header.items() if k != "__metadata__")


def test_a_view_is_recorded_against_the_named_tensor_that_holds_it():
    big = torch.randn(8, 4)
    a, b = big[:4], big[4:]
    pool = WeightPool({"a": a, "b": b})
    assert pool.add(b.t())["view_of"] == "b" and pool.add(a.t())["view_of"] == "a"
    assert pool.add(a.t()) == {"view_of": "a", "shape": [4, 4], "stride": [1, 4], "offset": 0}
    # another dtype over the same memory is not a view of it: pooled by value
    w = torch.randn(4, 16)
    other = WeightPool({"w": w}).add(w.view(torch.int32)[:, :8].t())
    assert isinstance(other, str) and other.startswith("constant.")


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(64))

    def forward(self, x):
        self.seen.add_(x)
        return x * 2


def test_state_a_graph_writes_is_not_lifted_into_the_shared_pool():
    frozen = _frozen(_Counter(), torch.ones(64))
    with pytest.raises(ValueError, match="writes its attribute 'seen' in place"):
        lift_constants(frozen)


def test_binding_refuses_a_host_table_of_another_dtype(tmp_path):
    from neuron_port.backends.weight_pool import bind_graphs, save_lifted

    torch.manual_seed(0)
    module, x, kv = _Tied(), torch.randn(3, 16), torch.zeros(3, 16)
    frozen = _frozen(module, x, kv)
    word = module.embed.weight.detach()
    save_lifted({"g.pt": frozen}, tmp_path, WeightPool({"host:word": word, "up.weight": module.up.weight.detach()}))
    bound = bind_graphs(tmp_path, ["g.pt"], {"word": word})["g.pt"]
    assert torch.equal(bound(x, kv.clone())[0], frozen(x, kv.clone())[0])
    with pytest.raises(ValueError, match="expected torch.float32"):
        bind_graphs(tmp_path, ["g.pt"], {"word": word.double()})
