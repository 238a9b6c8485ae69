"""The port command: all three Gemma-4 sizes checked, tp 2 over gloo, KV bytes, a prompt over the largest
bucket."""


import json

from neuron_port import describe, load_config
from neuron_port.graph.kv import kv_store_spec, naive_kv_bytes
from tests.helpers import run_cli


def test_kv_bytes_tiny_e2b_owners_only_rings_at_window():
    layout = describe(load_config("gemma-4-e2b", tiny=True))
    kv_len = 256
    spec = kv_store_spec(layout, kv_len)
    expected = 0
    for i in layout.kv_owners:
        s = layout.layers[i]
        slots = s.window if s.attention == "sliding" else kv_len
        expected += 2 * s.n_kv * slots * s.head_dim * 4
    assert spec.total_bytes(1, 4) == expected
    assert set(spec.bytes_per_layer()) == set(layout.kv_owners) == {0, 1, 2, 3, 4, 5}
    assert naive_kv_bytes(layout, kv_len, 1, 4) == sum(2 * s.n_kv * kv_len * s.head_dim * 4 for s in layout.layers)
    res = run_cli("port", "gemma-4-e2b", "--tiny", "--kv-len", "256", "--max-new-tokens", "4", "--json")
    assert json.loads(res.stdout)["kv_cache_bytes"] == expected


def _port_json(*args):
    res = run_cli("port", *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_port_cli_check_all_three_sizes():
    for name in ("gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"):
        d = _port_json(name, "--tiny", "--check")
        layout = describe(load_config(name, tiny=True))
        assert d["prompt_tokens"] > layout.sliding_window
        assert d["new_tokens"] >= 48
        assert d["seq_match"] is True and d["tokens"] == d["reference_tokens"], d["divergence"]
        assert d["kv_cache_bytes"] < d["kv_cache_bytes_naive"]
        for key in ("model", "backend", "tp", "prefill_s", "decode_tok_per_s"):
            assert key in d


def test_port_cli_tp2_gloo():
    """The command at tp 2 (gloo ranks); the 12B's ranks are compared logit by logit in test_tp_execution."""
    d = _port_json("gemma-4-e4b", "--tiny", "--tp", "2", "--check")
    assert d["tp"] == 2 and d["seq_match"] is True and d["new_tokens"] >= 48


def test_prompt_over_largest_bucket_is_a_clear_error():
    res = run_cli("port", "gemma-4-e2b", "--tiny", "--prompt-len", "200", "--buckets", "32,64", "--json")
    assert res.returncode != 0
    assert "200 tokens" in res.stderr and "largest prompt bucket (64)" in res.stderr
    assert res.stdout == ""
