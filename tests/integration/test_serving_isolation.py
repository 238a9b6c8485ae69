"""The server under hostile and heavy use: one bad request cannot hurt the others, the event loop
never blocks, metrics survive any path, and OpenAI's parameters mean what they mean."""


from __future__ import annotations

import concurrent.futures
import json
import re
import signal
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
from tests.helpers import ServerProcess  # noqa: E402

MODEL = "gemma-4-e2b"
GOOD = [[2, 17, 33, 5, 92], [2, 41, 7, 300, 12, 58], [2, 9, 77, 140]]


@pytest.fixture(scope="module")
def server(tiny_e2b_server):
    return tiny_e2b_server


def _complete(srv, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(srv.base + "/v1/completions", json={"model": MODEL, **body}, timeout=timeout)


def _greedy(prompt, n=12):
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "return_token_ids": True}


def test_a_poisoned_request_does_not_touch_the_three_batched_with_it(server):
    bodies = [_greedy(p) for p in GOOD] + [{**_greedy([2, 5, 6]), "seed": 2**64}]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda b: _complete(server, b), bodies))
    poisoned = replies[-1]
    assert poisoned.status_code == 400 and poisoned.json()["error"]["param"] == "seed"
    for prompt, reply in zip(GOOD, replies[:-1], strict=True):
        alone = _complete(server, _greedy(prompt))
        assert reply.status_code == alone.status_code == 200
        assert reply.json()["choices"][0]["token_ids"] == alone.json()["choices"][0]["token_ids"]
        assert reply.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]


def _generated(srv) -> int:
    text = httpx.get(srv.base + "/metrics").text
    return int(next(line for line in text.splitlines() if line.startswith("neuron_port_generated_tokens_total")).split()[1])


def test_a_chunked_body_over_the_limit_is_refused_before_it_runs(server):
    before = _generated(server)
    prefix = json.dumps({"model": MODEL, "prompt": [2, 5, 6], "max_tokens": 8, "ignore_eos": True})[:-1]

    def chunks():  # valid JSON first, then padding past the limit: no Content-Length, chunked
        yield (prefix + ', "user": "').encode()
        for _ in range(11):
            yield b"x" * 100_000
        yield b'"}'

    r = httpx.post(server.base + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 413
    time.sleep(0.5)
    assert _generated(server) == before  # nothing of it ran
    assert 'route="/v1/completions",status="413"' in httpx.get(server.base + "/metrics").text


def test_a_whole_request_whose_client_leaves_is_cancelled():
    """Not streamed: the server notices the client is gone while it waits, and frees the slot."""
    srv = ServerProcess(MODEL, "--tiny", "--max-batch", "2", "--buckets", "32", "--kv-lens", "4096")
    try:
        def counter(name: str) -> int:
            text = httpx.get(srv.base + "/metrics").text
            return int(next(line for line in text.splitlines() if line.startswith(name)).split()[1])

        with pytest.raises(httpx.TimeoutException):
            _complete(srv, _greedy([2, 5, 6], 4000), timeout=0.5)
        deadline = time.monotonic() + 30
        while counter("neuron_port_cancelled_requests_total") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counter("neuron_port_cancelled_requests_total") == 1
        time.sleep(0.5)
        assert counter("neuron_port_requests_running") == 0 and counter("neuron_port_generated_tokens_total") < 4000
    finally:
        srv.stop()


def test_health_answers_while_a_ten_megabyte_prompt_is_refused(server):
    huge = json.dumps({"model": MODEL, "prompt": "hello world " * 900_000})
    assert len(huge) > 10_000_000
    result = {}

    def post():
        result["reply"] = httpx.post(server.base + "/v1/completions", content=huge,
                                     headers={"content-type": "application/json"}, timeout=120)

    sender = threading.Thread(target=post)
    sender.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    assert httpx.get(server.base + "/health", timeout=5).status_code == 200
    assert time.monotonic() - t0 < 1.0
    sender.join(120)
    assert result["reply"].status_code == 413 and result["reply"].json()["error"]["code"] == 413


def test_a_short_request_finishes_while_a_long_one_decodes(server):
    finished = {}
    long_body = {**_greedy([2, 10, 11, 12, 13], 240), "stream": True}

    def long():
        with httpx.stream("POST", server.base + "/v1/completions", json={"model": MODEL, **long_body}, timeout=300) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    finished["long"] = time.monotonic()

    t = threading.Thread(target=long)
    t.start()
    time.sleep(0.5)  # the long one is decoding
    short = _complete(server, _greedy([2, 30, 31, 32], 6))
    finished["short"] = time.monotonic()
    t.join(300)
    assert finished["short"] < finished["long"]
    alone = _complete(server, _greedy([2, 30, 31, 32], 6))
    assert short.json()["choices"][0]["token_ids"] == alone.json()["choices"][0]["token_ids"]


_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"(,|(?=\})))*\})? [-+0-9.eEinfINFaN]+$')


def _parses(text: str) -> list[str]:
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    bad = [line for line in samples if not _SAMPLE.match(line)]
    assert not bad, bad
    return samples


def test_metrics_parse_after_hostile_and_random_paths(server):
    before = len(_parses(httpx.get(server.base + "/metrics").text))
    for path in ['/q"x\\y', "/a\nb", "/%22%5C", "/v1/../../etc", *(f"/random/{i}" for i in range(40))]:
        httpx.get(server.base + path.replace("\n", "%0A"), timeout=10)
    text = httpx.get(server.base + "/metrics").text
    samples = _parses(text)
    assert len(samples) <= before + 2  # at most an 'unmatched' 404 series (and the metrics route's own)
    assert 'route="unmatched",status="404"' in text
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    assert {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")} <= families


def test_openai_parameters_mean_what_they_mean(server):
    two = _complete(server, {"prompt": [2, 5, 6, 7], "max_tokens": 5, "n": 2, "temperature": 0.9, "seed": 3,
                             "logprobs": 2}).json()
    assert [c["index"] for c in two["choices"]] == [0, 1] and two["usage"]["completion_tokens"] == 10
    lp = two["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == 5 and all(len(t) == 2 for t in lp["top_logprobs"])
    assert all(v <= 0 for v in lp["token_logprobs"])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(5)]
    assert "".join(lp["tokens"]) == two["choices"][0]["text"]  # each token's own text, leading spaces kept
    unseeded = [_complete(server, {"prompt": [2, 5, 6, 7], "max_tokens": 8, "temperature": 1.5,
                                   "return_token_ids": True}).json()["choices"][0]["token_ids"] for _ in range(3)]
    assert len({tuple(u) for u in unseeded}) > 1  # no seed: not the same draw every time
    chat = httpx.post(server.base + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 3, "ignore_eos": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}],
    }).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(c["top_logprobs"]) == 3 and c["bytes"] is not None for c in content)
    assert content[0]["logprob"] == max(t["logprob"] for t in content[0]["top_logprobs"])  # greedy took the best
    with httpx.stream("POST", server.base + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": [2, 5], "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}) as r:  # no draw may end it early: the count is the point
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens"] == 3 and chunks[-1]["choices"] == []
    image = httpx.post(server.base + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert image.status_code == 400 and "messages" in image.json()["error"]["message"]
    for name, value in (("tools", []), ("response_format", {"type": "json_object"}), ("suffix", "!")):
        r = _complete(server, {"prompt": "hi", name: value})
        assert r.status_code == 400 and r.json()["error"]["message"] == f"the parameter '{name}' is not supported by this server"
    r = httpx.post(server.base + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "echo": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == "the parameter 'echo' is not supported by this server"
    for bad in ({"prompt": "hi", "logit_bias": {"\u00b2": 1}}, {"prompt": "hi", "logit_bias": {"1": 1, "01": 1}},
                {"prompt": "hi", "stream_options": {"include_usage": True}}):
        r = _complete(server, bad)
        assert r.status_code == 400 and r.json()["error"]["message"], bad
    r = httpx.post(server.base + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "top_logprobs": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "top_logprobs needs logprobs" in r.json()["error"]["message"]


def test_the_schema_says_what_the_server_does(server):
    schema = httpx.get(server.base + "/openapi.json", timeout=30).json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert "422" not in responses and {"400", "413", "429", "503"} <= set(responses)
        assert "text/event-stream" in responses["200"]["content"]


def test_draining_answers_503_to_new_requests_while_the_last_ones_finish():
    srv = ServerProcess(MODEL, "--tiny", "--max-batch", "2")
    lines, done = [], threading.Event()

    def stream():
        with httpx.stream("POST", srv.base + "/v1/completions", timeout=120,
                          json={"model": MODEL, **_greedy([2, 5, 6], 400), "stream": True}) as r:
            lines.extend(line for line in r.iter_lines() if line)
        done.set()

    t = threading.Thread(target=stream)
    t.start()
    while not lines:
        time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = httpx.post(srv.base + "/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=30)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    t.join(120)
    assert done.is_set() and lines[-1] == "data: [DONE]"
    assert srv.proc.wait(timeout=60) == 0
