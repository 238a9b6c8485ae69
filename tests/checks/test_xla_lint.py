"""The lowering report's findings (``lint --xla``), on reports written as the XLA backend writes them:
each rule fires on its own problem and nothing fires on a clean report; the table names the decode cost."""

from neuron_port.checks.xla_lint import DECODE_COST_BOUND, findings_of, format_lowering, lowering_result


def _report(**changes):
    base = {
        "graphs": 2,
        "uncached_compiles": 2,
        "cached_compiles": 30,
        "fallback_ops": {},
        "kv_tensors": {"prefill_32": 12, "decode_64": 12},
        "aliased_buffers": {"prefill_32": 12, "decode_64": 12},
        "hlo_opcodes": {"prefill_32": {"dot": 5}, "decode_64": {"dot": 5}},
        "dynamic_dimensions": {},
    }
    return {**base, **changes}


def _cost(ratio: float) -> dict:
    return {"graph": "decode_64", "bytes": int(1000 * ratio), "minimum_bytes": 1000, "ratio": ratio,
            "by_class": {"dot": 700, "kv_write": 0, "copy": int(1000 * ratio) - 900, "all_reduce": 0, "elementwise": 200},
            "context": 64}


def test_lint_findings_name_each_problem_and_nothing_on_a_clean_report():
    assert findings_of(_report()) == []
    assert findings_of(_report(decode_cost=_cost(ratio=1.3))) == []  # at the bound: no warning
    [traffic] = findings_of(_report(decode_cost=_cost(ratio=1.9)))
    assert traffic.severity == "warning" and not traffic.failed and "copy" in traffic.detail
    cases = {
        "xla-recompiles": _report(uncached_compiles=9),
        "xla-fallback": _report(fallback_ops={"aten::nonzero": 3}),
        "kv-not-aliased": _report(aliased_buffers={"prefill_32": 12, "decode_64": 0}),
        "neuron-rejected-hlo": _report(hlo_opcodes={"prefill_32": {"while": 1}, "decode_64": {}}),
        "dynamic-shape": _report(dynamic_dimensions={"decode_64": 2}),
        "decode-traffic": _report(decode_cost=_cost(ratio=1.9)),
    }
    for rule, report in cases.items():
        assert [f.name for f in findings_of(report)] == [rule]


def test_the_table_shows_each_graph_and_the_decode_cost():
    report = _report(hlo_instructions={"prefill_32": 900, "decode_64": 800}, compile_s={"prefill_32": 1.5},
                     devices=1, decode_cost=_cost(ratio=1.9))
    text = format_lowering(lowering_result("gemma-4-e2b tiny", 1, report))
    assert "decode_64" in text and "12/12" in text and "ratio 1.90" in text
    assert "[warning] decode-traffic at decode_64" in text and text.endswith("0 error(s)")
    assert DECODE_COST_BOUND == 1.3
