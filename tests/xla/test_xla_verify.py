"""Speculative decoding's verify graphs through torch-xla (the CPU PJRT device): over the one device-resident store,
prompt-lookup drafts verified give Hugging Face's greedy tokens, every graph keeps the store aliased, and a verify
step of S tokens writes exactly S rows per K/V tensor (the rows, not the store)."""

from __future__ import annotations

import pytest

from neuron_port import describe, load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.request import GenerationParams, GenerationRequest
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model
from neuron_port.parallel.ranks import RankSetup

pytestmark = pytest.mark.xla
PROMPTS = [[2, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [2, 9, 9, 9, 9, 9], [2, 30, 31, 32, 30, 31, 32, 30]]
NEW = [24, 30, 18]


def test_verify_graphs_on_xla_keep_greedy_tokens_and_write_only_their_rows():
    from neuron_port.backends.xla_port import xla_port
    from neuron_port.generation.generate import generate

    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    port, backend = xla_port(model, RankSetup.for_layout(describe(model), 1), PortShape([16], [64], draft_tokens=4),
                             batch=len(PROMPTS), decode_rows=())
    result = generate(port, GenerationRequest(PROMPTS, [GenerationParams(n) for n in NEW], draft_tokens=4))
    reference = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    assert result.tokens == [reference_generate(reference, p, n).tokens for p, n in zip(PROMPTS, NEW, strict=True)]
    assert result.accepted > 0  # drafts were kept: the verify graphs' logits decided tokens
    report = backend.report()
    verify = sorted(name for name in report["kv_tensors"] if name.startswith("verify_"))
    assert verify and report["fallback_ops"] == {}
    for name in verify:
        assert report["aliased_buffers"][name] == report["kv_tensors"][name] > 0, name  # the store stays resident
        written = report["hlo_traffic"][name]["kv_write"]
        assert written == int(name.split("_")[1]) * report["hlo_traffic"]["decode_64"]["kv_write"] > 0, name


def test_port_speculates_through_xla_with_hugging_faces_tokens():
    """``port --backend xla --speculate ngram``: Hugging Face's greedy tokens, drafts checked, and the verify graphs
    lowered beside prefill and decode."""
    import json
    import os
    import subprocess
    import sys

    from neuron_port.generation.prompts import random_prompt

    args = ["port", "gemma-4-e2b", "--tiny", "--backend", "xla", "--buckets", "16", "--kv-len", "64", "--prompt-len",
            "12", "--max-new-tokens", "24", "--json", "--speculate", "ngram", "--draft-tokens", "3"]
    proc = subprocess.run([sys.executable, "-m", "neuron_port", *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    drafted = json.loads(proc.stdout)
    config = load_config("gemma-4-e2b", tiny=True)
    prompt = random_prompt(config.vocab_size, 12, 0, config.bos_token_id)
    assert drafted["tokens"] == reference_generate(build_model(config, seed=0), prompt, 24).tokens
    assert drafted["speculation"]["drafted"] > 0
    assert any(name.startswith("verify_") for name in drafted["xla"]["kv_tensors"])


def test_verify_cost_benchmark_smoke():
    """A verify step of k = 2 drafts moves more than a decode step and far less than the k + 1 decode steps it
    stands for, and no less than its minimum; a higher acceptance models more tok/s."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verify_cost.py"), "--smoke", "--json"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"},
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = json.loads(proc.stdout)["results"]
    assert row["model"] == "gemma-4-e2b" and row["draft_tokens"] == 2 and row["context"] == 4096
    assert row["decode_bytes"] < row["verify_bytes"] < 3 * row["decode_bytes"]
    assert row["verify_bytes"] >= row["verify_minimum_bytes"] > 0
    rates = row["verify_tok_per_s"]
    assert rates["0.7"] > rates["0.5"] > 0 and row["speedup"]["0.7"] > 1
