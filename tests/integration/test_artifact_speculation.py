"""Verify graphs in a cpu artifact (``compile --draft-tokens K``): saved beside prefill and decode over the one pool of
weights, loaded by a fresh process, ``generate --speculate ngram`` gives Hugging Face's greedy tokens with drafts
kept, and the server speculates on them; what an artifact cannot do is refused in one line."""

from __future__ import annotations

import json
import re

import pytest

from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.prompts import random_prompt
from neuron_port.model.configs import load_config
from neuron_port.model.loading import build_model
from tests.helpers import cli_json, run_cli, run_cli_commands


@pytest.fixture(scope="module")
def drafted_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("drafted") / "e2b"
    result = run_cli("compile", "gemma-4-e2b", "--tiny", "--buckets", "16", "--kv-lens", "64", "--draft-tokens", "3",
                     "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["draft_tokens"] == 3
    return out


def test_a_fresh_process_speculates_on_the_artifacts_verify_graphs(drafted_artifact):
    rank = drafted_artifact / "rank0"
    assert sorted(p.name for p in rank.glob("verify_*.pt")) == ["verify_2.pt", "verify_3.pt", "verify_4.pt"]
    assert len(list(rank.glob("*.safetensors"))) == 1  # one pool of weights for every graph
    args = ["generate", str(drafted_artifact), "--prompt-len", "12", "--max-new-tokens", "24", "--json"]
    plain, drafted = run_cli_commands(args, [*args, "--speculate", "ngram"])
    config = load_config("gemma-4-e2b", tiny=True)
    want = reference_generate(build_model(config, seed=0), random_prompt(config.vocab_size, 12, 0, config.bos_token_id),
                              24).tokens
    assert cli_json(plain)["tokens"] == cli_json(drafted)["tokens"] == want
    spec = cli_json(drafted)["speculation"]
    assert spec["draft_tokens"] == 3 and spec["accepted"] > 0 and spec["verify_steps"] + spec["accepted"] == 23


def test_the_server_speculates_on_an_artifact(drafted_artifact):
    """A completion from an artifact served with ``--speculate ngram``: Hugging Face's greedy tokens, drafts counted."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from neuron_port.serve.app import build_app
    from neuron_port.serve.loading import load_served

    served = load_served(str(drafted_artifact), speculate="ngram", draft_tokens=2)
    prompt = [2, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    try:
        assert served.speculation == "ngram, up to 2 drafts per step" and served.engine.draft_tokens == 2
        client = TestClient(build_app(lambda: served))
        while client.get("/health").status_code != 200:
            pass
        body = {"model": served.model_id, "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        got = client.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]
        metrics = client.get("/metrics").text
    finally:
        served.engine.close()
    assert got == reference_generate(build_model(load_config("gemma-4-e2b", tiny=True), seed=0), prompt, 16).tokens
    counted = dict(re.findall(r'^(vllm:spec_decode_num_(?:draft|accepted)_tokens_total)\{[^}]*\} (\d+)$', metrics, re.M))
    assert int(counted["vllm:spec_decode_num_draft_tokens_total"]) >= int(counted[
        "vllm:spec_decode_num_accepted_tokens_total"]) > 0


@pytest.mark.parametrize("extra, says", [
    (["--speculate", "ngram", "--draft-tokens", "4"], "has them for 3: compile it with --draft-tokens K"),
    (["--speculate", "ngram", "--check"], "verify steps do not keep yet"),
])
def test_generate_refuses_what_the_artifact_cannot_speculate(drafted_artifact, extra, says):
    result = run_cli("generate", str(drafted_artifact), "--prompt-len", "8", "--max-new-tokens", "4", *extra)
    assert result.returncode == 2 and says in result.stderr, result.stderr


def test_verify_graphs_are_saved_in_cpu_artifacts_only(tmp_path):
    result = run_cli("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", "--draft-tokens", "2", "--out",
                     str(tmp_path / "x"))
    assert result.returncode == 2 and "verify graphs are saved in cpu artifacts for now" in result.stderr
