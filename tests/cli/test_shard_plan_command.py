"""The shard-plan command: the 12B's plan and a degree that does not divide."""


import json

from tests.helpers import run_cli


def test_shard_plan_cli_12b():
    res = run_cli("shard-plan", "gemma-4-12b", "--tp", "2", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    for layer in plan["layers"]:
        if layer["attention"] == "sliding":
            assert [len(r["kv_heads"]) for r in layer["ranks"]] == [4, 4]
        else:
            assert [r["kv_heads"] for r in layer["ranks"]] == [[0], [0]]


def test_shard_plan_cli_bad_degree():
    res = run_cli("shard-plan", "gemma-4-e4b", "--tp", "3")
    assert res.returncode != 0
    assert "valid tp degrees: [1, 2, 4, 8]" in res.stderr
