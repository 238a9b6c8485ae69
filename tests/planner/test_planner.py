"""Capacity planner: anchors, formulas, the plan command, property tests, and KV bytes equal to what the
runtime allocates."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port import describe, load_config
from neuron_port.backends.hlo_cost import minimum_decode_bytes
from neuron_port.graph.kv import kv_store_spec
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model
from neuron_port.parallel.per_core import core_params, device_params_per_core, rank0_kv_heads
from neuron_port.parallel.sharding import plan_model
from neuron_port.planner import TARGETS, Target, plan_capacity
from tests.helpers import run_cli, run_cli_json

MiB = 1 << 20


def _plan_json(*args):
    return run_cli_json("plan", *args)


def test_plan_recommendations_and_reasons():
    e2b = _plan_json("gemma-4-e2b")
    assert e2b["recommended_tp"] == 1 and e2b["dtype"] == "bf16" and e2b["fits"]
    # one set of weights bound to both graphs (the default, what the backends build): the E4B fits one core
    e4b = _plan_json("gemma-4-e4b")
    assert e4b["recommended_tp"] == 1 and e4b["fits"] and e4b["per_core_bytes"]["second_graph"] == 0
    assert "plan --separate-weights) the recommended tp would be 2" in " ".join(e4b["reasons"])
    # with a copy per graph (the field report's first E4B try) one core overflows
    e4b_separate = _plan_json("gemma-4-e4b", "--separate-weights")
    assert e4b_separate["recommended_tp"] == 2
    why = " ".join(_plan_json("gemma-4-e4b", "--separate-weights", "--tp", "1")["reasons"])
    assert "tp 1 does not fit" in why and "7.46 B real parameters" in why and "effective" in why
    b12 = _plan_json("gemma-4-12b")
    assert b12["recommended_tp"] == 2 and b12["fits"] and b12["per_core_bytes"]["second_graph"] == 0
    # two copies at tp 2 need ~25 GiB per core: no inf2.xlarge degree fits
    separate = _plan_json("gemma-4-12b", "--separate-weights")
    assert separate["recommended_tp"] is None and separate["tp"] == 2 and not separate["fits"]
    assert "the recommended tp would be 2: 12.74 GiB per core" in " ".join(separate["reasons"])
    for d, measured in ((e2b, 44.0), (e4b_separate, 36.0), (b12, 15.0)):
        assert d["roofline_tok_per_s"] > d["measured_tok_per_s"] == measured
        for key in ("model", "target", "tp", "per_core_bytes", "kv_bytes", "kv_bytes_owners_full_length", "kv_bytes_naive",
                    "host_ram_bytes", "compile_host_ram_bytes", "reasons"):
            assert key in d
        assert {"weights", "kv", "other"} <= set(d["per_core_bytes"])
        assert {"full", "slim"} == set(d["host_ram_bytes"])


def test_plan_e2b_long_context_kv():
    d = _plan_json("gemma-4-e2b", "--context", "32768")
    assert d["kv_bytes"] <= 200 * MiB
    assert d["kv_bytes_owners_full_length"] == 576 * MiB
    assert d["kv_bytes_naive"] == 1344 * MiB


def test_roofline_matches_the_reference_figures():
    """facts.md: E2B ~ (1.88 B + 0.40 B) x 2 B / 410 GB/s ~ 90 tok/s; 12B ~ 34 tok/s on two cores."""
    e2b = load_config("gemma-4-e2b")
    assert abs(device_params_per_core(describe(e2b), e2b, 1) - (1.88e9 + 0.40e9)) / 2.28e9 < 0.01
    assert 85 < _plan_json("gemma-4-e2b")["roofline_tok_per_s"] < 92
    assert 29 < _plan_json("gemma-4-12b")["roofline_tok_per_s"] < 35


@pytest.mark.parametrize("name,tp", [("gemma-4-e2b", 1), ("gemma-4-e4b", 2), ("gemma-4-12b", 2)])
def test_the_roofline_reads_the_kv_once_per_attending_layer(name, tp):
    """The roofline's token reads the core's weights and the K/V every layer attends: a layer sharing
    another's K/V reads it again. Its bytes are the decode-cost minimum's (less the new rows), so the
    planner and the HLO reader judge a step against one figure."""
    config = load_config(name)
    layout = describe(config)
    context = 32768
    plan = plan_capacity(layout, config, name, TARGETS["inf2.xlarge"], "bf16", tp, context)
    store = kv_store_spec(layout, context, kv_heads=rank0_kv_heads(layout, tp))
    weights = plan.per_core_bytes["weights"]
    minimum = minimum_decode_bytes(weights, store, context, 1, 2, layout.kv_readers())
    assert plan.kv_read_bytes_per_token == minimum - weights - store.row_bytes(1, 2)
    assert plan.roofline_tok_per_s == round(TARGETS["inf2.xlarge"].hbm_bw_per_core / (weights + plan.kv_read_bytes_per_token), 1)
    shares = any(spec.kv_source != spec.index for spec in layout.layers)
    once_each = store.attended_bytes(context, 1, 2)
    assert (plan.kv_read_bytes_per_token > once_each) == shares
    if not shares:
        assert plan.kv_read_bytes_per_token == once_each


def test_plan_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    assert run_cli("plan", "gemma-4-12b", "--png", str(out)).returncode == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_custom_target_and_bad_input():
    t = Target.parse("custom:cores=4,hbm_gib=24,bw_gbs=1600,host_gib=64")
    assert t.cores == 4 and t.hbm_per_core == 24 << 30 and t.hbm_bw_per_core == 400e9
    with pytest.raises(ValueError, match="unknown target"):
        Target.parse("inf3.huge")
    assert run_cli("plan", "gemma-4-e4b", "--tp", "3").returncode != 0


_CFG = {n: (load_config(n), describe(load_config(n))) for n in ("gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b")}


@settings(max_examples=12)
@given(st.sampled_from(sorted(_CFG)), st.sampled_from([1, 2]), st.integers(128, 65536), st.sampled_from(["bf16", "fp32"]))
def test_plan_is_monotonic(name, tp, context, dtype):
    config, layout = _CFG[name]
    target = TARGETS["inf2.8xlarge"]
    base = plan_capacity(layout, config, name, target, dtype, tp, context)
    longer = plan_capacity(layout, config, name, target, dtype, tp, context * 2)
    assert longer.per_core_bytes["kv"] >= base.per_core_bytes["kv"]
    assert longer.roofline_tok_per_s <= base.roofline_tok_per_s
    if tp == 1:
        wider = plan_capacity(layout, config, name, target, dtype, 2, context)
        assert wider.per_core_bytes["weights"] < base.per_core_bytes["weights"]
    if dtype == "bf16":
        bigger = plan_capacity(layout, config, name, target, "fp32", tp, context)
        assert bigger.per_core_bytes["total"] > base.per_core_bytes["total"]
    assert base.kv_bytes <= base.kv_bytes_owners_full_length * tp <= base.kv_bytes_naive * tp


@pytest.mark.parametrize("name", sorted(_CFG))
@pytest.mark.parametrize("tp", [1, 2])
def test_planner_kv_bytes_equal_what_the_runtime_allocates(name, tp):
    config = load_config(name, tiny=True)
    model = build_model(config, seed=0)
    layout = describe(model)
    kv_heads = plan_model(layout, tp).local_kv_heads(0) if tp > 1 else None
    port = Port.over_model(model, PortShape([16], [64]), layout, kv_heads)
    allocated = sum(t.numel() * t.element_size() for t in port.inputs.new_store(1, 64))
    plan = plan_capacity(layout, config, name, TARGETS["inf2.xlarge"], "fp32", tp, context=64)
    assert plan.per_core_bytes["kv"] == allocated


def test_int8_weights_halve_the_projections_and_keep_the_head():
    """12B at tp 2: the projections at one byte plus an fp32 scale per output channel, the replicated
    LM head and norms still bf16 -> per-core weights ~0.58 of bf16's, roofline ~1.7x."""
    bf16, int8 = (_plan_json("gemma-4-12b", "--tp", "2", "--quant", q) for q in ("none", "int8"))
    assert int8["quant"] == "int8" and bf16["quant"] == "none"
    share = int8["per_core_bytes"]["weights"] / bf16["per_core_bytes"]["weights"]
    assert 0.5 < share < 0.62
    assert 1.6 < int8["roofline_tok_per_s"] / bf16["roofline_tok_per_s"] < 2.0
    e2b = load_config("gemma-4-e2b")
    counted = core_params(describe(e2b), e2b, 1)
    plan = plan_capacity(describe(e2b), e2b, "gemma-4-e2b", TARGETS["inf2.xlarge"], quant="int8")
    assert plan.per_core_bytes["weights"] == counted.projections + 4 * counted.projection_rows + 2 * (
        counted.head + counted.other)
    with pytest.raises(ValueError, match="quant must be one of"):
        plan_capacity(describe(e2b), e2b, "gemma-4-e2b", TARGETS["inf2.xlarge"], quant="fp4")


def test_an_int8_head_takes_the_replicated_head_to_one_byte_too():
    """--quant-head on the 12B at tp 2: the vocab x hidden head, replicated on both cores, drops from two
    bytes per element to one plus an fp32 scale per vocab row."""
    int8, head = (_plan_json("gemma-4-12b", "--tp", "2", "--quant", "int8", *extra) for extra in ((), ("--quant-head",)))
    assert head["quant"] == "int8+head"
    config = load_config("gemma-4-12b")
    layout = describe(config)
    saved = layout.vocab_size * layout.hidden_size - 4 * layout.vocab_size
    assert int8["per_core_bytes"]["weights"] - head["per_core_bytes"]["weights"] == saved
    assert head["roofline_tok_per_s"] > int8["roofline_tok_per_s"]


def test_the_compile_ram_and_field_figures_say_where_they_come_from():
    """The compile-RAM figure is an extrapolation from one field figure and the decode rate beside the roofline is the
    field report's, not this library's: the plan says both, in its text and its JSON."""
    text = run_cli("plan", "gemma-4-12b", "--tp", "2")
    assert text.returncode == 0
    assert "extrapolated from one field figure" in text.stdout and "an order of magnitude" in text.stdout
    assert "field figure 15.0 tok/s" in text.stdout and "not measured by this library" in text.stdout
    assert "measured 15.0" not in text.stdout
    data = run_cli_json("plan", "gemma-4-12b", "--tp", "2")
    assert "extrapolated from one field figure" in data["compile_host_ram_source"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(a=st.floats(0.0, 0.99), k=st.integers(0, 10))
def test_expected_tokens_per_step_is_the_kept_run_plus_one(a, k):
    from neuron_port.planner import expected_tokens_per_step

    tokens = expected_tokens_per_step(a, k)
    assert tokens == pytest.approx((1 - a ** (k + 1)) / (1 - a))  # the geometric sum, closed form
    assert 1.0 <= tokens <= k + 1
    assert expected_tokens_per_step(a, k + 1) >= tokens and expected_tokens_per_step(min(1.0, a + 0.01), k) >= tokens


def test_expected_tokens_per_step_matches_drawn_verify_steps():
    """Draw verify steps: each draft kept with probability a while the ones before it were; the mean tokens a step
    makes (kept drafts + the target's own) is the formula's."""
    from neuron_port.planner import expected_tokens_per_step

    generator = torch.Generator().manual_seed(0)
    for a, k in ((0.5, 4), (0.7, 2), (0.9, 8)):
        kept = torch.rand(40_000, k, generator=generator) < a
        made = 1 + kept.int().cumprod(dim=1).sum(dim=1).float()
        assert float(made.mean()) == pytest.approx(expected_tokens_per_step(a, k), rel=0.02)
    assert expected_tokens_per_step(1.0, 4) == 5 and expected_tokens_per_step(0.0, 4) == 1
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        expected_tokens_per_step(1.5, 4)


def test_the_speculative_roofline_uses_the_plans_own_bytes():
    from neuron_port.planner import TARGETS, speculative_roofline

    config = load_config("gemma-4-12b")
    target = TARGETS["inf2.xlarge"]
    plan = plan_capacity(describe(config), config, "gemma-4-12b", target, "bf16", 2, 2048, (128,), 1, False, True)
    spec = speculative_roofline(plan, target, 4, [0.0, 0.7, 1.0])
    assert spec["decode_tok_per_s"] == pytest.approx(plan.roofline_tok_per_s, abs=0.1)
    assert [r["speedup"] for r in spec["rows"]] == [1.0, pytest.approx(2.773, abs=1e-3), 5.0]
    drafted = plan.per_core_bytes["weights"] // 10  # a drafter moving a tenth of the target's bytes per token
    slower = speculative_roofline(plan, target, 4, [0.7], drafter_step_bytes=drafted)
    decode = plan.per_core_bytes["weights"] + plan.kv_read_bytes_per_token
    assert slower["verify_step_bytes"] == decode + 4 * drafted
    assert slower["rows"][0]["speedup"] == pytest.approx(2.7731 * decode / (decode + 4 * drafted), abs=2e-3)
    cli = _plan_json("gemma-4-12b", "--tp", "2", "--draft-tokens", "4", "--acceptance", "0,0.7,1")
    assert cli["speculation"] == spec
