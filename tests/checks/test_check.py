"""The one verdict type: statuses and lint severities map one to one, and both JSON renderings keep
the fields the commands print."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_port.checks.check import SEVERITY_OF_STATUS, STATUSES, Check


@given(st.sampled_from(sorted(SEVERITY_OF_STATUS.values())), st.text(max_size=12), st.text(max_size=12))
def test_a_finding_round_trips_through_its_severity(severity, where, detail):
    finding = Check.finding("rule", severity, where, detail, "do this")
    assert finding.severity == severity and finding.failed == (severity == "error")
    assert finding.to_finding() == {"rule": "rule", "severity": severity, "where": where, "detail": detail, "fix": "do this"}


def test_json_keeps_the_fields_the_doctor_prints():
    assert Check("tokenizer", "pass", "loads").to_json() == {"name": "tokenizer", "status": "pass", "detail": "loads",
                                                             "fix": ""}
    assert Check("op", "warn", "slow", "fuse it", "decode_32").to_json()["where"] == "decode_32"


def test_bad_statuses_and_severities_are_named():
    with pytest.raises(ValueError, match=re.escape(f"one of {STATUSES}, found 'ok'")):
        Check("x", "ok", "")
    with pytest.raises(ValueError, match="found 'fatal'"):
        Check.finding("x", "fatal", "", "", "")
    with pytest.raises(ValueError, match="a 'pass' check has no lint severity"):
        _ = Check("x", "pass", "").severity
