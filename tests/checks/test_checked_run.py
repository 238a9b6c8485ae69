"""A checked run's record: its verdict, and its JSON there and back (the fresh-process check's boundary)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.checks.check import Check
from neuron_port.checks.checked_run import CheckedRun, Divergence, LogitReport, TokenMatch

STATUS = st.sampled_from(["pass", "fail", "skip", "warn"])
DIVERGENCE = st.none() | st.builds(Divergence, st.integers(0, 40), st.sampled_from(["near_tie", "error"]),
                                   st.integers(0, 99), st.integers(0, 99), st.floats(0, 5)) | st.builds(
    Divergence, st.integers(0, 40), st.just("length differs"))


def _run(statuses, divergence, must_match, rows=()):
    checks = [Check(f"c{i}", status, f"detail {i}", "fix" if status == "fail" else "") for i, status in enumerate(statuses)]
    run = {"tokens": [5, 6, 7], "backend": "cpu"}
    row_matches = [TokenMatch([5, 6, 7], d) for d in rows]
    if rows:
        run["rows"] = [{"prompt_tokens": 3, "tokens": [5, 6, 7]} for _ in rows]
    return CheckedRun(run=run, checks=checks, logits=LogitReport(3, 1e-6, 0, 1e-3), quant=None,
                      match=row_matches[0] if rows else TokenMatch([5, 6, 7], divergence), row_matches=row_matches,
                      tokens_must_match=must_match)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(statuses=st.lists(STATUS, max_size=4), divergence=DIVERGENCE, must_match=st.booleans(),
       rows=st.lists(DIVERGENCE, max_size=3))
def test_the_verdict_and_its_json_round_trip(statuses, divergence, must_match, rows):
    checked = _run(statuses, divergence, must_match, rows)
    tokens_ok = checked.seq_match or not must_match
    assert checked.passed == (tokens_ok and "fail" not in statuses)
    assert checked.seq_match == (all(d is None for d in rows) if rows else divergence is None)
    out = json.loads(json.dumps(checked.to_json()))
    assert out["seq_match"] == checked.seq_match and out["self_checks_passed"] == ("fail" not in statuses)
    back = CheckedRun.from_json(out)
    assert back == checked and back.passed == checked.passed


def test_a_run_without_checks_reports_only_its_own_fields():
    assert CheckedRun(run={"tokens": [1]}).to_json() == {"tokens": [1]}
    assert CheckedRun(run={"tokens": [1]}).passed and CheckedRun().seq_match is None


def test_a_reduced_precision_run_is_judged_by_its_checks_not_its_tokens():
    diverged = TokenMatch([1, 2], Divergence(1, "near_tie", 3, 2, 0.01))
    assert CheckedRun(match=diverged, tokens_must_match=False).passed
    assert not CheckedRun(match=diverged, tokens_must_match=True).passed
    assert not CheckedRun(match=diverged, tokens_must_match=False, checks=[Check("logits", "fail", "off")]).passed
