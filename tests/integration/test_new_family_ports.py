"""port --check at tp 2 on the tiny Mistral, Qwen2, Gemma-3 text and Phi-3."""


from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

"""24 tokens: three sliding windows of the tiny variants."""
NEW = ["mistral", "qwen2", "gemma-3", "phi-3"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_port_tiny_tp2_check_cli(name):
    res = run_cli("port", name, "--tiny", "--tp", "2", "--max-new-tokens", "16", "--check", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["seq_match"] is True and out["tp"] == 2
    assert all(c["status"] == "pass" for c in out["self_checks"])
