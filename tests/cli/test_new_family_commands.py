"""The shard-plan command on Phi-3, whose KV heads straddle the ranks at tp 2."""


from __future__ import annotations

import json

from tests.helpers import run_cli

"""24 tokens: three sliding windows of the tiny variants."""


def test_phi3_straddles_at_tp2():
    out = json.loads(run_cli("shard-plan", "phi-3", "--tiny", "--tp", "2", "--json").stdout)
    layer = out["layers"][0]
    assert layer["strategy"] == "straddle"
    assert [r["kv_heads"] for r in layer["ranks"]] == [[0, 1], [1, 2]]
