"""The XLA path (torch-xla on the CPU PJRT device): the lowering torch-neuronx records graphs through.

Marked ``xla``: skipped where torch-xla is absent; ``.ci/run`` runs them in a second virtualenv
with torch 2.8 + torch-xla 2.8. The command-line checks run in fresh processes (XLA's device
count is fixed per process); the in-process checks use one device.
"""


from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from neuron_port import describe, load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.logits import softcap
from neuron_port.graph.kv import kv_store_spec
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model
from neuron_port.parallel.per_core import device_params_per_core
from neuron_port.parallel.ranks import RankSetup
from tests.helpers import ROOT

pytestmark = pytest.mark.xla
PROMPT = [2, 17, 33, 5, 92, 41, 7, 300, 12, 58, 9, 77, 140, 3, 64, 211, 18, 25, 90, 8]  # longer than the tiny windows


def _port_cli(*args: str) -> dict:
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, "-m", "neuron_port", "port", *args, "--tiny", "--backend", "xla", "--check",
                           "--json"], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("args", [("gemma-4-e2b",), ("gemma-4-e4b",), ("gemma-4-12b",), ("gemma-4-12b", "--tp", "2"),
                                  ("gemma-4-e4b", "--tp", "2")], ids=["e2b", "e4b", "12b", "12b-tp2", "e4b-tp2"])
def test_port_through_xla_matches_hugging_face_and_lowers_cleanly(args):
    d = _port_cli(*args, "--max-new-tokens", "32")
    x = d["xla"]
    assert d["seq_match"] is True and d["new_tokens"] == 32 and d["prompt_tokens"] == 24
    assert x["fallback_ops"] == {}
    graphs = {"prefill_32", "decode_256"}  # both observed: their HLO was read, not assumed
    assert set(x["kv_tensors"]) == set(x["aliased_buffers"]) == set(x["hlo_opcodes"]) == graphs
    assert x["uncached_compiles"] <= x["graphs"] == 2
    for graph in graphs:
        assert x["aliased_buffers"][graph] == x["kv_tensors"][graph] > 0, graph  # the whole store stays resident
    tp = int(args[2]) if len(args) > 2 else 1
    assert x["devices"] == tp
    # both graphs read one set of device weights: one model moved, its bytes once
    model = build_model(load_config(args[0], tiny=True), seed=0)
    state_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())
    # (at tp > 1 the SPMD layout adds the plan's expanded K/V rows; a second copy would double it)
    assert x["weight_copies"] == 1 and state_bytes <= x["weight_bytes_to_device"] < 1.5 * state_bytes
    for graph in graphs:
        assert (x["hlo_opcodes"][graph].get("all-reduce", 0) > 0) == (tp > 1), graph
    # what a decode step moves on each device, against the least it must (read per device from the
    # partitioned module at tp > 1, so its weights are the core's share)
    cost = d["decode_cost"]
    assert cost == x["decode_cost"] and cost["graph"] == "decode_256" and cost["context"] == 256
    assert cost["bytes"] == x["hlo_traffic"]["decode_256"]["total"] >= cost["minimum_bytes"] > 0
    assert (cost["by_class"]["all_reduce"] > 0) == (tp > 1)


def _xla_run(model, shape, tokens, keep_logits=False):
    from neuron_port.backends.xla_port import xla_port
    from neuron_port.generation.generate import generate
    from neuron_port.generation.request import GenerationRequest

    port, backend = xla_port(model, RankSetup.for_layout(describe(model), 1), shape)
    return port, generate(port, GenerationRequest.greedy([PROMPT], tokens, keep_logits=keep_logits)), backend.report()


# In-process runs use shapes no other test in this process compiles: a graph XLA already compiled
# comes from its cache, and its HLO is then not observed.
def test_logits_of_every_step_match_and_short_steps_read_a_prefix_on_the_device(tiny_e2b):
    """Two KV lengths over one store of 48 slots on the device: the prefill writes into it, decode at 32 attends
    over its prefix inside the graph and decode at 48 over all of it; every graph aliases the whole store, and
    no store is copied between them (no graph but the three)."""
    port, got, report = _xla_run(tiny_e2b, PortShape(32, (32, 48)), 24, keep_logits=True)
    ref = reference_generate(tiny_e2b, PROMPT, 24)
    assert got.tokens[0] == ref.tokens
    ours = softcap(torch.stack([step[0] for step in got.step_logits]), describe(tiny_e2b).softcap)
    theirs = torch.stack(ref.logits)
    assert (ours - theirs).abs().max() / theirs.abs().max() < 1e-4  # tolerance: relative to the largest logit
    assert set(report["compile_s"]) == {"prefill_32", "decode_32", "decode_48"}
    assert got.step_kv_lens[0] == 32 and got.step_kv_lens[-1] == 48
    assert report["aliased_buffers"] == report["kv_tensors"] and report["uncached_compiles"] == 3
    # the decode cost: the longest decode graph's traffic against the least a step at 48 positions moves,
    # counted here from the model itself (every device weight once in fp32, the whole store once per
    # layer attending it, one new row per owner)
    cost, layout = report["decode_cost"], describe(tiny_e2b)
    weights = device_params_per_core(layout, tiny_e2b.config, 1) * 4
    kv = kv_store_spec(layout, 48)
    assert cost["graph"] == "decode_48" and cost["context"] == 48
    readers = {owner: sum(spec.kv_source == owner for spec in layout.layers) for owner in layout.kv_owners}
    attended = sum(slot.bytes(1, 4) * readers[slot.layer] for slot in kv.slots)
    assert cost["minimum_bytes"] == weights + attended + kv.row_bytes(1, 4)
    assert cost["bytes"] == report["hlo_traffic"]["decode_48"]["total"] >= cost["minimum_bytes"]
    assert cost["by_class"]["dot"] >= weights  # every weight goes through a matmul once


def test_lint_findings_catch_a_store_copied_in_and_out(tiny_e2b, monkeypatch):
    """Without the write-back the store is not aliased, and the finding says so."""
    from neuron_port.backends.xla import XlaRunner
    from neuron_port.checks.xla_lint import findings_of

    clean = _xla_run(tiny_e2b, PortShape(24, 40), 4)[2]
    assert findings_of(clean) == [] and set(clean["aliased_buffers"]) == {"prefill_24", "decode_40"}
    monkeypatch.setattr(XlaRunner, "write_back", False)
    port, got, report = _xla_run(tiny_e2b, PortShape(24, 56), 4)
    assert got.tokens[0] == reference_generate(tiny_e2b, PROMPT, 4).tokens  # still right, only slower
    assert "kv-not-aliased" in {f.name for f in findings_of(report)}


def test_lint_findings_catch_a_step_without_its_sync(tiny_e2b, monkeypatch):
    """Without one sync per step every step records all earlier ones: more compiles than graphs. Three
    steps show it (each compiles a longer graph than the last, so the cost grows with the square of
    the count: six took 76.5 s against 24.5 s, measured side by side)."""
    from neuron_port.backends.xla import XlaRunner
    from neuron_port.checks.xla_lint import findings_of

    monkeypatch.setattr(XlaRunner, "sync_each_step", False)
    _, got, report = _xla_run(tiny_e2b, PortShape(20, 72), 3)
    assert report["uncached_compiles"] >= 3 and report["cached_compiles"] == 0  # every step compiled anew
    assert "xla-recompiles" in {f.name for f in findings_of(report)}


def test_lint_command_at_tp2_decodes_by_length_on_the_devices():
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, "-m", "neuron_port", "lint", "gemma-4-e4b", "--xla", "--tp", "2", "--json"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    x = d["xla"]
    assert d["errors"] == 0 and x["devices"] == 2
    assert set(x["hlo_instructions"]) == {"prefill_32", "decode_32", "decode_64"}
    assert all(x["hlo_opcodes"][g].get("all-reduce", 0) > 0 for g in ("prefill_32", "decode_32", "decode_64"))


def test_the_12b_recipe_on_the_xla_path():
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "gemma4_12b.py"), "--backend", "xla",
                           "--max-new-tokens", "16"], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SEQ_MATCH True" in proc.stdout and "on 2 XLA device(s)" in proc.stdout and "[xla] 0 error(s)" in proc.stdout


def test_xla_lowering_benchmark_smoke():
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "xla_lowering.py"), "--smoke", "--json"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tiny = json.loads(proc.stdout)["tiny"]
    assert tiny["tokens_equal"] and tiny["port"]["cold"]["uncached_compiles"] == 2
    assert tiny["port"]["warm"]["uncached_compiles"] == 0
    assert tiny["hf_static_cache"]["cold"]["uncached_compiles"] > 0 and tiny["ratio_hf_over_port"]["ms_per_token_warm"] > 0


def test_decode_cost_benchmark_smoke():
    """The row write moves fewer bytes than the blend it replaced, and both fewer than Hugging Face's
    static-cache decode; nothing moves less than the minimum."""
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_cost.py"), "--smoke", "--json"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = json.loads(proc.stdout)["results"]
    assert row["model"] == "gemma-4-e2b" and row["context"] == 4096
    assert 1 <= row["ratio"] < row["blend_ratio"] < row["hf_ratio"]
    assert row["bytes"] >= row["minimum_bytes"] and row["by_class"]["kv_write"] > 0 == row["blend_by_class"]["kv_write"]


_PREFILL_UPDATE = """
import json, sys
from neuron_port.backends.xla_port import xla_port
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config
from neuron_port.model.layout import describe
from neuron_port.model.loading import build_model
from neuron_port.parallel.ranks import RankSetup
model = build_model(load_config("gemma-4-12b", tiny=True), seed=0)
setup = RankSetup.for_layout(describe(model), 1)
port, backend = xla_port(model, setup, PortShape([16], [512]), prefill_update=sys.argv[1] == "1")
tokens = generate(port, GenerationRequest.greedy([json.loads(sys.argv[2])], max_new_tokens=6)).tokens[0]
report = backend.report()
full = sum(1 for slot in port.stores.specs[512].slots if not slot.ring)
print(json.dumps({"tokens": tokens, "full_owners": full, "opcodes": report["hlo_opcodes"]["prefill_16"],
                  "bytes": report["hlo_traffic"]["prefill_16"]["total"]}))
"""


def test_a_prefill_writes_its_full_buffers_by_dynamic_update_slice():
    """The prefill's by-position write lowers to one dynamic-update-slice per full-attention buffer (K and V
    of each full owner), as NxD Inference emits it, where ``slice_scatter`` lowers to a select over each
    buffer: the same tokens, and fewer bytes moved by the prefill graph."""
    runs = {}
    for flag in ("1", "0"):
        proc = subprocess.run([sys.executable, "-c", _PREFILL_UPDATE, flag, json.dumps(PROMPT[:12])], capture_output=True,
                              text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[flag] = json.loads(proc.stdout.strip().splitlines()[-1])
    dus, scatter = runs["1"], runs["0"]
    assert dus["full_owners"] > 0 and dus["tokens"] == scatter["tokens"]
    assert dus["opcodes"].get("dynamic-update-slice", 0) == 2 * dus["full_owners"], dus["opcodes"]
    assert scatter["opcodes"].get("dynamic-update-slice", 0) == 0
    print(f"[xla] 12B tiny prefill_16 into 512 positions: {dus['bytes']:,} bytes by dynamic-update-slice, "
          f"{scatter['bytes']:,} by slice_scatter", file=sys.stderr)
    assert dus["bytes"] < scatter["bytes"]


def test_decode_by_occupancy_on_xla_runs_the_one_row_graph_over_the_one_device_store(tiny_e2b, monkeypatch):
    """A port compiled by XLA for 2 rows also carries 1-row decode graphs; a lone request in the slot batch runs
    them (each takes the whole device store and reads and writes its first row), a pair runs the 2-row ones, the
    tokens are Hugging Face's, and every graph aliases the whole store."""
    from neuron_port.backends.xla_port import xla_port
    from neuron_port.generation.request import GenerationParams
    from tests.helpers import record_decode_rows, run_slot_schedule

    port, backend = xla_port(tiny_e2b, RankSetup.for_layout(describe(tiny_e2b), 1), PortShape(24, (40,)), batch=2)
    assert sorted(port.runners.decode_rows) == [1]
    used = record_decode_rows(monkeypatch.setattr)
    prompts = [PROMPT[:9], PROMPT[:5]]
    alone = run_slot_schedule(port, [(0, prompts[0], GenerationParams(8))], 2)[0]
    assert alone == reference_generate(tiny_e2b, prompts[0], 8).tokens and set(used) == {1}
    used.clear()
    pair = run_slot_schedule(port, [(0, p, GenerationParams(8)) for p in prompts], 2)
    assert [pair[0], pair[1]] == [reference_generate(tiny_e2b, p, 8).tokens for p in prompts] and set(used) == {2}
    report = backend.report()
    assert {"prefill_24", "decode_40", "decode_40_rows1"} <= set(report["aliased_buffers"])
    assert report["aliased_buffers"] == report["kv_tensors"]
