"""The app in process (FastAPI's test client, a tiny model): health says loading, then ok, or the
loading error; the API key and draining gate every /v1 route before it runs; a completion comes back
as the engine made it, and every answer is counted."""

import threading
import time

import pytest

pytest.importorskip("fastapi")  # the serve extra; the torch-xla virtualenv collects without it

from fastapi.testclient import TestClient  # noqa: E402

from neuron_port.serve.app import build_app  # noqa: E402
from neuron_port.serve.loading import load_served  # noqa: E402


def _wait_ok(client: TestClient) -> None:
    for _ in range(600):
        if client.get("/health").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError(client.get("/health").json())


def test_health_gate_and_a_completion():
    release = threading.Event()
    served = []

    def load():
        release.wait(30)
        served.append(load_served("gemma-4-e2b", tiny=True, max_batch=2, buckets=(16,), kv_lens=(64,)))
        return served[0]

    client = TestClient(build_app(load, api_key="k"))
    try:
        assert client.get("/health").json() == {"status": "loading"}
        assert client.post("/v1/completions", json={"model": "gemma-4-e2b", "prompt": [2, 5], "max_tokens": 2}).status_code == 401
        key = {"Authorization": "Bearer k"}
        loading = client.post("/v1/completions", json={"model": "gemma-4-e2b", "prompt": [2, 5], "max_tokens": 2}, headers=key)
        assert loading.status_code == 503 and loading.headers["Retry-After"]
        release.set()
        _wait_ok(client)
        assert client.get("/v1/models", headers=key).json()["data"][0]["id"] == "gemma-4-e2b"
        body = {"model": "gemma-4-e2b", "prompt": [2, 5, 6, 7], "max_tokens": 3, "temperature": 0, "return_token_ids": True}
        reply = client.post("/v1/completions", json=body, headers=key).json()
        assert len(reply["choices"][0]["token_ids"]) == 3 and reply["usage"]["completion_tokens"] == 3
        assert client.post("/v1/completions", json={**body, "colour": 1}, headers=key).json()["error"]["param"] == "colour"
        client.app.state.neuron_port["draining"] = True
        assert client.post("/v1/completions", json=body, headers=key).status_code == 503
        metrics = client.get("/metrics").text
        assert 'status="401"' in metrics and 'status="200"' in metrics and 'status="400"' in metrics
    finally:
        release.set()
        for s in served:
            s.engine.close()


def test_a_failed_load_is_what_health_reports():
    def load():
        raise FileNotFoundError("no weights here")

    client = TestClient(build_app(load))
    for _ in range(100):
        answer = client.get("/health")
        if answer.json()["status"] != "loading":
            break
        time.sleep(0.02)
    assert answer.status_code == 503 and answer.json() == {"status": "failed", "error": "FileNotFoundError: no weights here"}
    refused = client.post("/v1/completions", json={"model": "m", "prompt": [2], "max_tokens": 1})
    assert refused.status_code == 503 and "no weights here" in refused.json()["error"]["message"]
