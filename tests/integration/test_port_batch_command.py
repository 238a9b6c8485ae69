"""port --batch 4 --check: every row checked on its own against Hugging Face."""


import json

from tests.helpers import run_cli


def test_port_cli_batch_of_four_checked_row_by_row():
    res = run_cli("port", "gemma-4-e2b", "--tiny", "--batch", "4", "--check", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["seq_match"] is True and len(d["rows"]) == 4
    assert len({r["prompt_tokens"] for r in d["rows"]}) == 4
    assert all(r["seq_match"] for r in d["rows"])
    assert d["host_ms_per_token"] > 0
