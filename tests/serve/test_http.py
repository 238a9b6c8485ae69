"""The server's HTTP pieces on a bare ASGI app (no model): the body limit answers 413 before the app
runs (declared or chunked), the front door turns an escaped exception into a JSON 500 and counts
every answer, validation errors name their parameter, and the OpenAPI document lists real codes."""

import asyncio
import json

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

pytest.importorskip("fastapi")  # the serve extra; the torch-xla virtualenv collects without it

from fastapi import FastAPI  # noqa: E402

from neuron_port.serve.http import BodyLimit, FrontDoor, documented_openapi, validation_message  # noqa: E402
from neuron_port.serve.schemas import NOT_IMPLEMENTED  # noqa: E402


class _Echo:
    """An ASGI app that answers 200 with the body it read; ``calls`` counts how often it ran."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    async def __call__(self, scope, receive, send):
        self.calls += 1
        if self.fail:
            raise RuntimeError("boom")
        message = await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": message.get("body", b"")})


def _call(app, chunks: list[bytes], headers=()) -> tuple[int, bytes]:
    """Run one HTTP request through ``app``; (status, body)."""
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": list(headers)}
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_the_body_limit_refuses_before_the_app_runs():
    counted = []
    inner = _Echo()
    app = BodyLimit(inner, limit=10, count=lambda scope, status: counted.append(status))
    assert _call(app, [b"12345", b"678"]) == (200, b"12345678")  # chunks joined, then replayed whole
    status, body = _call(app, [b"x" * 4], headers=[(b"content-length", b"11")])  # declared too long: never read
    assert status == 413 and json.loads(body)["error"]["param"] == "body" and "10 bytes" in body.decode()
    assert _call(app, [b"123456", b"789012"])[0] == 413  # a chunked body passing the limit
    assert inner.calls == 1 and counted == [413, 413]


def test_the_front_door_answers_json_and_counts_every_answer():
    counted = []
    count = lambda scope, status: counted.append(status)  # noqa: E731
    status, body = _call(FrontDoor(_Echo(fail=True), lambda scope: None, count), [b"{}"])
    assert status == 500 and json.loads(body)["error"]["message"] == "internal error: RuntimeError: boom"
    assert _call(FrontDoor(_Echo(), lambda scope: None, count), [b"ok"]) == (200, b"ok")
    assert counted == [500, 200]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_tokens: int


def _errors(payload) -> list[dict]:
    try:
        _Body.model_validate(payload)
    except ValidationError as exc:
        return exc.errors()
    raise AssertionError("valid")


def test_validation_messages_name_the_parameter():
    assert validation_message(_errors({"max_tokens": "many"}))[1] == "max_tokens"
    unknown = validation_message(_errors({"max_tokens": 1, "colour": 3}))
    assert unknown == ("unknown parameter 'colour'", "colour")
    name = sorted(NOT_IMPLEMENTED)[0]
    assert validation_message(_errors({"max_tokens": 1, name: 1}))[0] == f"the parameter {name!r} is not supported by this server"
    assert validation_message([{"type": "json_invalid", "ctx": {"error": "Expecting value"}}])[0].endswith("Expecting value")


def test_the_openapi_document_lists_the_codes_the_server_returns():
    app = FastAPI(title="t")

    @app.post("/v1/completions")
    def completions(body: _Body) -> dict:
        return {}

    responses = documented_openapi(app)["paths"]["/v1/completions"]["post"]["responses"]
    assert "422" not in responses and {"400", "401", "404", "413", "429", "500", "503"} <= set(responses)
    assert documented_openapi(app) is app.openapi_schema  # computed once
