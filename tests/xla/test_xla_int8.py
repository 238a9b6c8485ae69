"""``--quant int8`` on the XLA path: the int8 projections reach the device as int8 (``s8`` entry parameters
of the optimized HLO, each widened by a ``convert`` next to its matmul), one compile per graph shape, no
fallbacks, tokens and logits of the same quantized model, and the decode step's minimum counts the
projections at one byte (with their fp32 scales)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neuron_port import describe, load_config
from neuron_port.model.loading import build_model
from neuron_port.model.quant import Int8Linear, apply_quant
from neuron_port.parallel.launch import identity_reduce
from neuron_port.parallel.per_core import core_params
from neuron_port.parallel.ranks import RankSetup, make_rank

pytestmark = pytest.mark.xla


@pytest.mark.parametrize("name,tp,scheme", [("gemma-4-e2b", 1, "int8+head"), ("gemma-4-e4b", 2, "int8")],
                         ids=["e2b-head", "e4b-tp2"])
def test_port_int8_through_xla_keeps_int8_weights_on_the_device(name, tp, scheme):
    """At tp 2 (SPMD) each device holds its share of the int8 weights: the partitioned module's s8
    parameters are the rank's int8 shard, not the whole model's. With --quant-head the LM head is one
    more s8 parameter (the word table stays on the host)."""
    flags = ["--quant", "int8"] + (["--quant-head"] if scheme == "int8+head" else [])
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, "-m", "neuron_port", "port", name, "--tiny", "--tp", str(tp), *flags,
                           "--backend", "xla", "--check", "--max-new-tokens", "16", "--json"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)
    x = d["xla"]
    assert d["seq_match"] and d["self_checks_passed"] and d["logit_check"]["max_relative_error"] < 1e-3
    assert x["fallback_ops"] == {} and x["uncached_compiles"] <= x["graphs"] == 2
    assert x["aliased_buffers"] == x["kv_tensors"]
    model = apply_quant(build_model(load_config(name, tiny=True), seed=0), scheme)
    assert d["quant"] == scheme
    layout = describe(model)
    if tp == 1:
        int8 = [m for m in model.modules() if isinstance(m, Int8Linear)]
    else:  # rank 0's shard: what device 0 holds (K/V rows expanded by the plan, as the SPMD layout has them)
        setup = RankSetup.for_layout(layout, tp)
        int8 = [m for m in make_rank(setup, 0, identity_reduce, model).model.modules() if isinstance(m, Int8Linear)]
    for graph in ("prefill_32", "decode_256"):
        found = x["int8_weights"][graph]
        assert found["parameters"] == len(int8) and found["bytes"] == sum(m.weight.numel() for m in int8), graph
        assert found["converts"] >= found["parameters"], graph  # each widened on the device, not on the host
    weights = core_params(layout, model.config, tp).weight_bytes(4, scheme)
    assert d["decode_cost"]["minimum_bytes"] > weights  # the int8 count, plus the K/V and the new rows
    assert d["decode_cost"]["minimum_bytes"] < core_params(layout, model.config, tp).weight_bytes(4)
