"""Speculative decoding in the server (in process, FastAPI's test client): with prompt lookup on the real SmolLM2 and
with a Gemma-4 drafter on the tiny E2B, greedy completions are Hugging Face's greedy tokens, and ``/metrics`` counts
exactly what the offline path (``generate`` with the same drafts) drafted and kept; a slim server speculates on its
compiled verify graphs; what cannot speculate is refused in one line before anything loads."""

from __future__ import annotations

import re
import time

import pytest

pytest.importorskip("fastapi")  # the serve extra; the torch-xla virtualenv collects without it

from fastapi.testclient import TestClient  # noqa: E402

from neuron_port.errors import NeuronPortError  # noqa: E402
from neuron_port.serve.app import build_app  # noqa: E402
from neuron_port.serve.loading import load_served  # noqa: E402
from tests.helpers import run_cli  # noqa: E402

# prompts that repeat their own context, so prompt lookup has something to find
TEXTS = ["Copy this list twice: apples, pears, plums, grapes, figs. apples, pears, plums,",
         "The code is A1 B2 C3 D4 E5. Again: A1 B2 C3 D4 E5. Once more: A1 B2"]
NEW = 20


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _serve(load) -> TestClient:
    client = TestClient(build_app(load))
    for _ in range(1200):
        if client.get("/health").status_code == 200:
            return client
        time.sleep(0.05)
    raise AssertionError(client.get("/health").json())


def _complete(client: TestClient, model: str, prompts: list, n: int) -> list[list[int]]:
    body = {"model": model, "prompt": prompts, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return [choice["token_ids"] for choice in sorted(reply.json()["choices"], key=lambda c: c["index"])]


def test_prompt_lookup_in_the_server_keeps_greedy_tokens_and_counts_its_drafts(smollm2_dir):
    from transformers import AutoModelForCausalLM

    from neuron_port.checks.oracle import reference_generate
    from neuron_port.generation.generate import generate
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.graph.shapes import PortShape

    served = []

    def load():
        served.append(load_served(str(smollm2_dir), max_batch=2, buckets=(64,), kv_lens=(256,), speculate="ngram",
                                  draft_tokens=4, model_id="smol"))
        return served[0]

    client = _serve(load)
    try:
        assert served[0].speculation == "ngram, up to 4 drafts per step"
        ids = [served[0].encode(text) for text in TEXTS]
        got = _complete(client, "smol", TEXTS, NEW)  # both prompts decode together, in two slots
        metrics = client.get("/metrics").text
    finally:
        for s in served:
            s.engine.close()
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir)).eval()
    assert got == [reference_generate(hf, prompt, NEW).tokens for prompt in ids]
    drafted = accepted = 0
    for prompt in ids:  # the offline path, each prompt alone: a row's drafts do not depend on its neighbours
        run = generate(hf, GenerationRequest.greedy([prompt], NEW, draft_tokens=4), shape=PortShape((64,), (256,)))
        assert run.tokens[0] == got[ids.index(prompt)]
        drafted, accepted = drafted + run.drafted, accepted + run.accepted
    assert accepted > 0  # prompt lookup found the repeats
    assert _metric(metrics, "vllm:spec_decode_num_draft_tokens_total") == drafted
    assert _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    assert _metric(metrics, "neuron_port_request_draft_acceptance_rate_count") == 2
    assert _metric(metrics, "vllm:spec_decode_num_drafts_total") > 0


def test_a_gemma4_drafter_in_the_server_keeps_greedy_tokens_and_counts_its_drafts():
    from neuron_port.checks.oracle import reference_generate
    from neuron_port.generation.generate import generate
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.configs import load_config
    from neuron_port.model.drafter import build_drafter
    from neuron_port.model.loading import model_from_name

    served = []

    def load():  # seed 0: the target's weights; the tiny drafter's are seed 1
        served.append(load_served("gemma-4-e2b", tiny=True, max_batch=2, buckets=(16,), kv_lens=(64,),
                                  speculate="assistant", draft_tokens=3))
        return served[0]

    client = _serve(load)
    prompts = [[2, 5, 6, 7, 8, 9], [2, 40, 41, 42]]
    try:
        got = _complete(client, "gemma-4-e2b", prompts, 10)
        metrics = client.get("/metrics").text
    finally:
        for s in served:
            s.engine.close()
    model = model_from_name("gemma-4-e2b", tiny=True)
    assert got == [reference_generate(model, prompt, 10).tokens for prompt in prompts]
    drafter = build_drafter(load_config("gemma-4-e2b", tiny=True), seed=1)
    drafted = accepted = 0
    for prompt in prompts:
        run = generate(model, GenerationRequest.greedy([prompt], 10, draft_tokens=3), shape=PortShape((16,), (64,)),
                       drafter=drafter)
        drafted, accepted = drafted + run.drafted, accepted + run.accepted
    assert drafted > 0
    assert _metric(metrics, "vllm:spec_decode_num_draft_tokens_total") == drafted
    assert _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total") == accepted


def test_a_slim_server_speculates_on_its_compiled_verify_graphs():
    """``serve --slim --speculate ngram``: the verify graphs compiled with the rest (cpu TorchScript, every slot's row),
    the model dropped; greedy completions are Hugging Face's tokens, drafts kept."""
    from neuron_port.checks.oracle import reference_generate
    from neuron_port.model.loading import model_from_name

    served = []

    def load():
        served.append(load_served("gemma-4-e2b", tiny=True, slim=True, max_batch=2, buckets=(16,), kv_lens=(64,),
                                  speculate="ngram", draft_tokens=3))
        return served[0]

    client = _serve(load)
    prompts = [[2, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [2, 30, 31, 32, 30, 31, 32, 30]]
    try:
        port = served[0].engine.batch.port
        assert port.graphs is None and sorted(port.runners.verify) == [2, 3, 4]
        got = _complete(client, "gemma-4-e2b", prompts, 16)
        metrics = client.get("/metrics").text
    finally:
        for s in served:
            s.engine.close()
    model = model_from_name("gemma-4-e2b", tiny=True)
    assert got == [reference_generate(model, prompt, 16).tokens for prompt in prompts]
    assert _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total") > 0


@pytest.mark.parametrize("args, says", [
    (["--slim", "--speculate", "assistant"], "--speculate assistant runs the drafter over eager graphs"),
    (["--draft", "d", "--speculate", "ngram"], "--draft names the drafter of --speculate assistant"),
    (["--speculate", "ngram", "--draft-tokens", "0"], "--draft-tokens is 1 or more with --speculate, found 0"),
])
def test_serve_refuses_what_cannot_speculate_in_one_line(args, says):
    result = run_cli("serve", "gemma-4-e2b", "--tiny", *args)
    assert result.returncode == 2 and says in result.stderr


def test_an_artifact_without_verify_graphs_cannot_speculate(tiny_e2b_artifact):
    with pytest.raises(NeuronPortError, match="which this artifact does not hold: compile it with --draft-tokens K"):
        load_served(str(tiny_e2b_artifact), speculate="ngram")
    with pytest.raises(NeuronPortError, match="runs the drafter over a model's eager graphs"):
        load_served(str(tiny_e2b_artifact), speculate="assistant", draft="d")
