"""Artifacts across processes: tp 2 compile then generate in a fresh process, a killed compile, a fresh-process
check and reload."""


import json
import subprocess
import sys

import pytest
import torch

from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from tests.helpers import copy_tree, load_rank0_port, run_cli, run_cli_process


@pytest.mark.slow
def test_tp2_compile_then_generate_in_a_fresh_process(tmp_path):
    out = tmp_path / "e4b_tp2"
    res = run_cli_process("compile", "gemma-4-e4b", "--tiny", "--tp", "2", "--backend", "cpu", "--out", str(out))
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tp"] == 2 and len(manifest["kv_layout"]) == 2
    res = run_cli_process("generate", str(out), "--prompt-len", "24", "--max-new-tokens", "32", "--check", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["seq_match"] is True and d["new_tokens"] == 32 and d["tokens"] == d["reference_tokens"]
    _served_tp2_matches_generate(out)


def _served_tp2_matches_generate(out):
    """The server over a tp 2 artifact (rank 0 in the server, rank 1 stepping with it in lockstep) answers
    two concurrent requests with Hugging Face's greedy tokens."""
    pytest.importorskip("fastapi")
    import concurrent.futures

    import httpx

    from neuron_port.checks.oracle import reference_generate, teacher_forced_logits
    from neuron_port.model.loading import load_source
    from tests.helpers import ServerProcess

    prompts = [[2, 17, 33, 5, 92], [2, 41, 7, 300, 12, 58]]
    srv = ServerProcess(str(out))
    try:
        def ask(prompt):
            body = {"model": out.name, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                    "return_token_ids": True}
            return httpx.post(srv.base + "/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            served = list(pool.map(ask, prompts))
        # a scored prompt: its tokens fed one decode step each, on both ranks
        body = {"model": out.name, "prompt": prompts[1], "max_tokens": 0, "echo": True, "logprobs": 1}
        scored = httpx.post(srv.base + "/v1/completions", json=body, timeout=120).json()["choices"][0]["logprobs"]
    finally:
        assert srv.stop() == 0
    model, _ = load_source("gemma-4-e4b", tiny=True, seed=json.loads((out / "manifest.json").read_text())["source"]["seed"])
    for prompt, tokens in zip(prompts, served, strict=True):  # Hugging Face in this process: no third set of ranks to start
        assert tokens == reference_generate(model, prompt, 12).tokens
    with torch.no_grad():
        logp = torch.log_softmax(teacher_forced_logits(model, prompts[1]).double(), dim=-1)
    want = logp[torch.arange(len(prompts[1]) - 1), torch.tensor(prompts[1][1:])]
    assert scored["token_logprobs"][0] is None
    # two ranks sum their partial products in another order than one forward: 1e-3, lm-eval parity's bound
    assert (torch.tensor(scored["token_logprobs"][1:], dtype=torch.float64) - want).abs().max() < 1e-3


def test_fresh_process_check_returns_data_and_names_the_childs_failure(tiny_e2b_artifact, tmp_path):
    from neuron_port.checks.validation import check_in_fresh_process
    from neuron_port.errors import ArtifactError

    checked = check_in_fresh_process(tiny_e2b_artifact, prompt_len=12, max_new_tokens=6)
    assert checked.passed and checked.seq_match and checked.logits.steps == 6
    assert [c.status for c in checked.checks] == ["pass", "skip", "pass"]
    result = checked.to_json()  # the same fields the child wrote
    assert result["seq_match"] is True and result["tokens"] == result["reference_tokens"] and len(result["tokens"]) == 6
    assert result["self_checks_passed"] is True and result["logit_check"]["steps"] == 6
    assert {c["name"]: c["status"] for c in result["self_checks"]} == {"embeddings": "pass", "attention": "skip",
                                                                        "logits": "pass"}
    broken = copy_tree(tiny_e2b_artifact, tmp_path)
    (broken / "rank0" / "decode_64.pt").write_bytes(b"not a graph")
    with pytest.raises(ArtifactError, match="fresh-process check failed: ArtifactError: .*decode_64.pt"):
        check_in_fresh_process(broken, prompt_len=12, max_new_tokens=6)


def test_loaded_artifact_equals_the_in_process_port(tiny_e2b, tiny_e2b_artifact):
    prompt = [2] + list(range(30, 50))
    eager = generate(Port.over_model(tiny_e2b, PortShape([32], [64])), GenerationRequest.greedy([prompt], 20)).tokens
    loaded = load_rank0_port(tiny_e2b_artifact)
    assert all(isinstance(r.function, torch.jit.ScriptModule) for r in loaded.runners.decode.values())
    # the saved graphs are the ones the static-shape passes rewrote, and they keep their batch
    assert not any(n.kind() == "aten::size" for r in loaded.runners.decode.values() for n in r.function.graph.nodes())
    assert loaded.batch == 1
    assert generate(loaded, GenerationRequest.greedy([prompt], 20)).tokens == eager
    res = run_cli_process("generate", str(tiny_e2b_artifact), "--max-new-tokens", "40", "--check", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["seq_match"] is True


def test_killed_compile_process_leaves_no_artifact(tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_port.cli.command", "compile", "gemma-4-12b", "--tiny", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import time

    deadline = time.time() + 60
    while time.time() < deadline and not any(p.name.startswith(".killed.partial") for p in tmp_path.iterdir()):
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert not out.exists()
    for partial in tmp_path.iterdir():  # whatever was left is not accepted
        res = run_cli("generate", str(partial))
        assert res.returncode != 0 and "manifest.json" in res.stderr
