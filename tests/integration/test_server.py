"""The OpenAI-compatible server, driven by the real openai client over 127.0.0.1."""


import concurrent.futures
import json
import signal
import threading

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from neuron_port.generation.generate import generate  # noqa: E402
from neuron_port.generation.request import GenerationRequest  # noqa: E402
from neuron_port.graph.port import Port  # noqa: E402
from neuron_port.graph.shapes import PortShape  # noqa: E402
from tests.helpers import ServerProcess, run_cli  # noqa: E402

MODEL = "gemma-4-e2b"


@pytest.fixture(scope="module")
def server(tiny_e2b_server):
    return tiny_e2b_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference_port(tiny_e2b):
    return Port.over_model(tiny_e2b, PortShape([32, 64, 128], [256, 512]))


def test_models_list(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completions_plain_and_streamed(client):
    full = client.completions.create(model=MODEL, prompt="hello world", max_tokens=10, temperature=0,
                                     extra_body={"ignore_eos": True})
    choice = full.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert full.usage.completion_tokens == 10 and full.usage.prompt_tokens == 3
    chunks = list(client.completions.create(model=MODEL, prompt="hello world", max_tokens=10, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_plain_and_streamed(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the capital of france is"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert full.choices[0].message.role == "assistant" and full.choices[0].message.content
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert text == full.choices[0].message.content


def test_greedy_through_the_server_equals_the_port_check_tokens(client):
    port = json.loads(run_cli("port", MODEL, "--tiny", "--check", "--json", "--prompt-len", "24").stdout)
    assert port["seq_match"]
    gen = torch.Generator().manual_seed(0 + 1000)
    prompt = torch.randint(3, 512, (24,), generator=gen).tolist()
    prompt[0] = 2
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=port["new_tokens"], temperature=0, seed=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    assert out.choices[0].model_extra["token_ids"] == port["tokens"] == port["reference_tokens"]


def test_sixteen_concurrent_clients_get_complete_correct_answers(server, reference_port):
    prompts = [[2] + [(7 * i + 13 * j) % 500 + 6 for j in range(5 + i % 7)] for i in range(16)]
    expected = [generate(reference_port, GenerationRequest.greedy([p], 12)).tokens[0] for p in prompts]

    def ask(i):
        c = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0, timeout=120)
        r = c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=12, temperature=0,
                                 extra_body={"ignore_eos": True, "return_token_ids": True})
        return r.choices[0].model_extra["token_ids"], r.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, range(16)))
    for (ids, reason), want in zip(results, expected, strict=True):
        assert ids == want and reason == "length"


@pytest.mark.parametrize("body,status", [
    ("{not json", 400),
    ({"model": MODEL, "prompt": 5}, 400),
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, 400),
    ({"model": MODEL, "prompt": "hi", "max_tokens": -4}, 400),
    ({"model": MODEL, "prompt": "hi", "n": 0}, 400),
    ({"model": MODEL, "prompt": "hi", "n": 9}, 400),
    ({"model": MODEL, "prompt": "hi", "echo": True, "stream": True}, 400),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400),
    ({"model": MODEL, "prompt": "hi", "logprob": 2}, 400),
    ({"model": MODEL, "prompt": "hi", "max_completion_tokens": 0}, 400),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 10**9}, 400),
    ({"model": MODEL, "prompt": "hi", "seed": 2**64}, 400),
    ({"model": MODEL, "prompt": "hi", "seed": -1}, 400),
    ({"model": MODEL, "prompt": "\ud800 lone"}, 400),
    ({"model": MODEL, "prompt": list(range(3, 300))}, 400),
    ({"model": MODEL, "prompt": [2, 99999]}, 400),
    ({"model": "other-model", "prompt": "hi"}, 404),
    ({"prompt": "hi"}, 400),
])
def test_bad_completions_get_openai_style_errors(server, body, status):
    data = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.base + "/v1/completions", content=data, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["code"] == status
    if body == {"model": MODEL, "prompt": list(range(3, 300))}:
        assert "297 tokens" in err["message"] and "(128)" in err["message"]


def test_bad_chat_requests_and_health_afterwards(server, client):
    for body in ({"model": MODEL, "messages": []}, {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
                 {"model": MODEL, "messages": "hello"}):
        r = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert httpx.get(server.base + "/health").status_code == 200
    metrics = httpx.get(server.base + "/metrics").text
    for name in ("neuron_port_requests_total", "neuron_port_request_latency_seconds_bucket", "neuron_port_queue_depth",
                 "neuron_port_host_rss_bytes", "neuron_port_generated_tokens_total"):
        assert name in metrics


@pytest.fixture(scope="module")
def small_server():
    srv = ServerProcess(MODEL, "--tiny", "--max-batch", "1", "--max-queue", "1", "--api-key", "sekret",
                        "--buckets", "32", "--kv-lens", "64,256", "--threads", "1")
    yield srv
    srv.stop()


def _auth():
    return {"authorization": "Bearer sekret"}


def test_api_key_required(small_server):
    r = httpx.get(small_server.base + "/v1/models", timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=small_server.base + "/v1", api_key="wrong", max_retries=0).models.list()
    ok = openai.OpenAI(base_url=small_server.base + "/v1", api_key="sekret", max_retries=0).models.list()
    assert ok.data[0].id == MODEL


def test_queue_limit_gives_429(small_server):
    body = {"model": MODEL, "prompt": [2, 5, 6], "max_tokens": 120, "temperature": 0, "ignore_eos": True}

    def post(_):
        return httpx.post(small_server.base + "/v1/completions", json=body, headers=_auth(), timeout=120).status_code

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(post, range(6)))
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}


def test_client_disconnect_frees_its_slot(small_server):
    def generated():
        text = httpx.get(small_server.base + "/metrics").text
        return int(next(line for line in text.splitlines() if line.startswith("neuron_port_generated_tokens_total")).split()[1])

    before = generated()
    body = {"model": MODEL, "prompt": [2, 5, 6], "max_tokens": 240, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", small_server.base + "/v1/completions", json=body, headers=_auth(), timeout=120) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # leave mid-stream
    after_cancel = httpx.post(small_server.base + "/v1/completions", headers=_auth(), timeout=120,
                              json={"model": MODEL, "prompt": [2, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    assert after_cancel.status_code == 200
    assert generated() - before < 240  # the abandoned request did not run to its end
    assert "neuron_port_cancelled_requests_total 1" in httpx.get(small_server.base + "/metrics").text


def test_a_client_that_leaves_a_whole_response_is_a_quiet_499(small_server):
    import time

    body = {"model": MODEL, "prompt": [2, 5, 6], "max_tokens": 240, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(small_server.base + "/v1/completions", json=body, headers=_auth(), timeout=0.5)
    deadline = time.time() + 30
    while "499 POST /v1/completions" not in small_server.output() and time.time() < deadline:
        time.sleep(0.2)
    out = small_server.output()
    assert "neuron-port: 499 POST /v1/completions from 127.0.0.1: the client closed the request" in out
    assert "Traceback" not in out and "CancelledError" not in out and "ERROR" not in out
    assert 'status="499"' in httpx.get(small_server.base + "/metrics").text


def test_head_probes_threads_and_logged_refusals(small_server):
    assert httpx.head(small_server.base + "/health").status_code == 200
    head = httpx.head(small_server.base + "/metrics")
    assert head.status_code == 200 and head.content == b""
    long = httpx.post(small_server.base + "/v1/completions", headers=_auth(), timeout=60,
                      json={"model": MODEL, "prompt": [2] * 40, "max_tokens": 2})
    message = long.json()["error"]["message"]
    assert long.status_code == 400 and "largest prompt bucket (32)" in message and "--buckets" in message
    odd = httpx.post(small_server.base + "/v1/completions", headers=_auth(), timeout=60,
                     json={"model": MODEL, "prompt": [2], "max_tokens": 2, "colour": "red"})
    assert odd.status_code == 400
    assert httpx.post(small_server.base + "/v1/completions", json={"model": MODEL, "prompt": [2]}).status_code == 401
    out = small_server.output()
    assert "neuron-port: 1 torch thread (--threads)" in out
    assert "neuron-port: 400 POST /v1/completions from 127.0.0.1: unknown parameter 'colour'" in out
    assert f"neuron-port: 400 POST /v1/completions from 127.0.0.1: {message}" in out
    assert "neuron-port: 401 POST /v1/completions from 127.0.0.1: missing or wrong API key" in out

_FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream", "n",
           "ignore_eos", "repetition_penalty", "max_completion_tokens", "extra"]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 600) | st.floats(-3, 3, allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       body=st.dictionaries(st.sampled_from(_FIELDS), _json_values, max_size=8),
       model_ok=st.booleans())
def test_fuzzed_requests_never_get_a_5xx(small_server, route, body, model_ok):
    schema = httpx.get(small_server.base + "/openapi.json", timeout=30).json()
    assert route in schema["paths"]
    if model_ok:
        body["model"] = MODEL
    body.pop("stream", None)
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
        body["max_tokens"] = 8  # keep the bounded run short; the value space is still explored below 8
    r = httpx.post(small_server.base + route, json=body, headers=_auth(), timeout=120)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]["message"]


def test_sigterm_drains_in_flight_requests():
    srv = ServerProcess(MODEL, "--tiny", "--max-batch", "1")
    chunks, done = [], threading.Event()
    started = threading.Event()

    def stream():
        body = {"model": MODEL, "prompt": [2, 5, 6], "max_tokens": 60, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    chunks.append(line)
                    started.set()
        done.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert done.is_set() and chunks[-1] == "data: [DONE]"
    tokens = sum(1 for c in chunks if c.startswith("data: {") and json.loads(c[6:])["choices"])
    assert tokens == 60
    assert srv.proc.wait(timeout=60) == 0


def _ids_of(choices):
    return [c.model_extra["token_ids"] for c in choices]


def test_a_batched_prompt_list_answers_each_prompt_as_its_own_request(client):
    """Every prompt form the API allows (lm-evaluation-harness sends a list of id lists): one
    choice per prompt, in order, each what that prompt alone gets; with n, prompt p's i-th choice
    is index p * n + i."""
    extra = {"ignore_eos": True, "return_token_ids": True}
    prompts = [[2, 17, 40, 41], [2, 9], [2, 300, 301, 302, 303, 304, 305]]
    alone = [_ids_of(client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0, extra_body=extra).choices)[0]
             for p in prompts]
    batched = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, extra_body=extra)
    assert [c.index for c in batched.choices] == [0, 1, 2]
    assert _ids_of(batched.choices) == alone
    assert batched.usage.prompt_tokens == sum(len(p) for p in prompts)
    texts = ["hello world", "the capital of france is"]
    one_by_one = [client.completions.create(model=MODEL, prompt=t, max_tokens=5, temperature=0, extra_body=extra).choices[0].text
                  for t in texts]
    together = client.completions.create(model=MODEL, prompt=texts, max_tokens=5, temperature=0, extra_body=extra)
    assert [c.text for c in together.choices] == one_by_one
    sampled = {"temperature": 0.9, "seed": 11, "n": 2, "max_tokens": 5, "extra_body": extra}
    each = [_ids_of(client.completions.create(model=MODEL, prompt=p, **sampled).choices) for p in prompts[:2]]
    both = client.completions.create(model=MODEL, prompt=prompts[:2], **sampled)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert _ids_of(both.choices) == each[0] + each[1]


def test_a_prompt_list_is_checked_prompt_by_prompt(small_server):
    body = {"model": MODEL, "prompt": [[2, 5], [2, 999999]], "max_tokens": 2}
    r = httpx.post(small_server.base + "/v1/completions", json=body, headers=_auth(), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "prompt 1" in r.json()["error"]["message"]
    many = {"model": MODEL, "prompt": [[2, 5]] * 40, "n": 2, "max_tokens": 2}
    r = httpx.post(small_server.base + "/v1/completions", json=many, headers=_auth(), timeout=60)
    assert r.status_code == 400 and "more than the server queues at once" in r.json()["error"]["message"]


def test_a_scored_prompt_may_be_longer_than_the_largest_bucket(server):
    """Scoring prefills a prompt's first token and feeds the rest one decode step each, so its limit
    is the context, not the largest prompt bucket (128 here, KV lengths up to 512)."""
    prompt = [2] + list(range(3, 200))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 0}
    plain = httpx.post(server.base + "/v1/completions", json={**body, "max_tokens": 1}, timeout=120)
    assert plain.status_code == 400 and "bucket" in plain.json()["error"]["message"]
    scored = httpx.post(server.base + "/v1/completions", json={**body, "echo": True, "logprobs": 0}, timeout=120)
    assert scored.status_code == 200, scored.text
    logprobs = scored.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert len(logprobs) == len(prompt) and logprobs[0] is None and all(lp <= 0 for lp in logprobs[1:])
    too_long = httpx.post(server.base + "/v1/completions", timeout=120,
                          json={**body, "prompt": [2] * 600, "echo": True, "logprobs": 0})
    assert too_long.status_code == 400 and "longer than the context of 512 tokens" in too_long.json()["error"]["message"]
