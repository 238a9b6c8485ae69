"""The describe and shard-plan commands on every shipped family's real config."""


from __future__ import annotations

import pytest

from neuron_port.model.configs import shipped_names
from tests.helpers import cli_json, run_cli


def test_the_cli_lists_both_families():
    assert {"llama", "qwen3"} <= set(shipped_names())


@pytest.mark.parametrize("name,total,kv_heads", [("llama", 1.236e9, 8), ("qwen3", 0.596e9, 8)])
def test_describe_real_configs(name, total, kv_heads):
    """Parameter totals agree with the published sizes (Llama-3.2-1B 1.24 B, Qwen3-0.6B 0.6 B)."""
    layout = cli_json(run_cli("describe", name, "--json"))
    assert abs(layout["params"]["total"] - total) / total < 0.01
    assert layout["kv_owners"] == list(range(layout["num_layers"]))
    assert {s["attention"] for s in layout["layers"]} == {"full"} and layout["sliding_window"] is None
    assert {s["n_kv"] for s in layout["layers"]} == {kv_heads}
    assert layout["params"]["per_layer_embedding"] == 0


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_shard_plans_at_tp2_and_tp4(name):
    """tp 2 splits the tiny KV heads; tp 4 has more ranks than KV heads and replicates them."""
    two = cli_json(run_cli("shard-plan", name, "--tiny", "--tp", "2", "--json"))
    four = cli_json(run_cli("shard-plan", name, "--tiny", "--tp", "4", "--json"))
    layer2, layer4 = two["layers"][0], four["layers"][0]
    assert layer2["n_kv"] == 2 and layer2["strategy"] == "shard"
    assert [r["kv_heads"] for r in layer2["ranks"]] == [[0], [1]]
    assert layer4["strategy"] == "replicate"
    assert [r["kv_heads"] for r in layer4["ranks"]] == [[0], [0], [1], [1]]
    q_per_rank = layer4["n_q"] // 4
    assert all(len(r["q_heads"]) == q_per_rank for r in layer4["ranks"])
    bad = run_cli("shard-plan", name, "--tiny", "--tp", "3")
    assert bad.returncode == 2 and "valid tp degrees" in bad.stderr
