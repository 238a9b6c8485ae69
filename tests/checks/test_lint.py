"""The graph linter: softcap overflow, index-assignment cache writes, SBUF working sets."""


import json

import torch
from hypothesis import given
from hypothesis import strategies as st

from neuron_port import describe, load_config
from neuron_port.checks.lint import SBUF_BYTES_PER_PARTITION, lint_model, sbuf_bytes_per_partition
from tests.helpers import run_cli


@given(st.integers(1, 1024), st.integers(1, 300_000), st.sampled_from([1, 2, 4]))
def test_sbuf_formula(rows, width, nbytes):
    got = sbuf_bytes_per_partition(rows, width, nbytes)
    assert got == -(-rows // 128) * width * nbytes
    assert sbuf_bytes_per_partition(rows + 128, width, nbytes) == got + width * nbytes


def test_lint_reports_softcap_overflow_only_when_in_graph():
    bad = lint_model("gemma-4-e2b", softcap_in_graph=True)
    tanh = [f for f in bad["findings"] if f["rule"] == "sbuf-overflow-vocab-elementwise" and "tanh" in f["where"]]
    assert tanh and "524,288 B per SBUF partition" in tanh[0]["detail"] and "196,608" in tanh[0]["detail"]
    assert "host" in tanh[0]["fix"]
    good = lint_model("gemma-4-e2b")
    assert good["errors"] == 0
    # decode as the neuron/nxd backends trace it: its K/V written back by rows (NxD Inference's own decode write)
    rows = [f for f in good["findings"] if f["rule"] == "kv-row-write"]
    assert len(rows) == 1 and rows[0]["where"].startswith("decode_32:") and rows[0]["severity"] == "info"
    assert not [f for f in good["findings"] if f["rule"] in ("sbuf-overflow-vocab-elementwise", "neuron-hostile-op")]
    assert SBUF_BYTES_PER_PARTITION == 196_608


def test_lint_flags_index_assignment_cache_writes():
    """Cache writes by index assignment are caught: index_put for index vectors, a baked value for scalars."""
    from neuron_port.checks.lint import _scan, _trace

    class IndexWrite(torch.nn.Module):
        def forward(self, buf, pos, new):
            out = buf.clone()
            out[pos] = new
            return out

    real = describe(load_config("gemma-4-e2b"))
    vector = _scan(_trace(IndexWrite(), [torch.zeros(8, 4), torch.tensor([3, 5]), torch.ones(2, 4)]), "g", 512, real, 2)
    assert any(f.name == "neuron-hostile-op" and "index_put" in f.where for f in vector)
    scalar = _scan(_trace(IndexWrite(), [torch.zeros(8, 4), torch.tensor(3), torch.ones(4)]), "g", 512, real, 2)
    assert any(f.name == "value-baked-into-trace" for f in scalar)


def test_lint_cli_12b_warns_about_fused_attention_window():
    res = run_cli("lint", "gemma-4-12b", "--json")
    d = json.loads(res.stdout)
    assert any(f["rule"] == "fused-attention-window" and "1024" in f["where"] for f in d["findings"])


def test_only_a_scatter_the_graph_returns_is_a_kv_row_write():
    """A scatter along the sequence into a KV store input, whose result is returned (through the tuples a
    cache hands around), is that store written back by rows; any other scatter is still an error: one that
    feeds something else, one into a tensor the graph made (a masked logits row), one along another dim."""
    from neuron_port.checks.lint import _scan, _trace

    class RowWrite(torch.nn.Module):
        def forward(self, new, slot, buf):
            pair = (buf.scatter(2, slot, new), new)
            key, _ = pair
            return new.sum(), key

    class ScatterUsed(torch.nn.Module):
        def forward(self, new, slot, buf):
            return buf.scatter(2, slot, new).sum()

    class MaskedLogits(torch.nn.Module):
        def forward(self, new, slot, buf):
            return (buf * 2).scatter(2, slot, new), buf

    class OtherDim(torch.nn.Module):
        def forward(self, new, slot, buf):
            return new.sum(), buf.scatter(1, slot, new)

    real = describe(load_config("gemma-4-e2b"))
    args = [torch.ones(1, 2, 1, 4), torch.zeros(1, 2, 1, 4, dtype=torch.long), torch.zeros(1, 2, 8, 4)]
    returned = _scan(_trace(RowWrite(), args), "g", 512, real, 2, kv_count=1)
    assert [f.name for f in returned] == ["kv-row-write"] and not any(f.failed for f in returned)
    assert any(f.failed for f in _scan(_trace(RowWrite(), args), "g", 512, real, 2, kv_count=0))  # not a KV input
    for bad in (ScatterUsed(), MaskedLogits(), OtherDim()):
        found = _scan(_trace(bad, args), "g", 512, real, 2, kv_count=1)
        assert any(f.name == "neuron-hostile-op" and "scatter" in f.where and f.failed for f in found), type(bad).__name__
