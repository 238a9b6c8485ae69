"""HTTP-level pieces of the server: the request-body limit, validation messages, the OpenAPI document.

* :class:`BodyLimit`: an ASGI middleware that answers 413 to a body over the limit — at once when
  ``Content-Length`` says so (the body is never read), or as soon as a chunked body passes it (the
  body is read up to the limit before the app sees any of it, so a refused request never runs).
* :func:`validation_message`: pydantic's first error as one line naming the parameter; an unknown
  parameter, or one OpenAI defines that this server does not implement, says exactly that.
* :func:`documented_openapi`: the schema FastAPI generates, corrected to what the server does:
  400 (not 422) with the error object, and 401, 404, 413, 429, 503.
* :func:`log_refusal`: one log line for every 4xx answer, with the reason the client was given.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from neuron_port.serve.reply import error
from neuron_port.serve.schemas import NOT_IMPLEMENTED

LOG = logging.getLogger("uvicorn.error")  # the server runs under uvicorn: its lines go where uvicorn's go


def log_refusal(scope: dict, status: int, body: bytes) -> None:
    """Log a 4xx answer with its reason (the error object's message): a warning, or an info line for a
    client that closed its request (499)."""
    if not 400 <= status < 500:
        return
    try:
        reason = json.loads(body or b"{}").get("error", {}).get("message") or ""
    except (ValueError, AttributeError):
        reason = ""
    client = (scope.get("client") or ("?",))[0]
    line = f"neuron-port: {status} {scope.get('method', '?')} {scope.get('path', '?')} from {client}"
    line += f": {reason}" if reason else ""
    LOG.log(logging.INFO if status == 499 else logging.WARNING, line)


class BodyLimit:
    """413 for request bodies over ``limit`` bytes; ``count(scope, 413)`` for each refusal."""

    def __init__(self, app: Any, limit: int, count: Any = None):
        self.app, self.limit, self.count = app, limit, count

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        if self.count is not None:
            self.count(scope, 413)
        response = error(413, f"the request body is larger than the server's limit of {self.limit} bytes", param="body")
        log_refusal(scope, 413, response.body)
        await response(scope, receive, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, receive, send)
        body, more = b"", True
        while more:  # read it all, up to the limit, before the app sees any of it
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, receive, send)  # a disconnect: the app hears it
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._refuse(scope, receive, send)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class FrontDoor:
    """Every HTTP request: ``gate(scope)`` may answer it first (auth, drain); otherwise the app runs,
    an exception it lets out becomes a JSON 500 (never plain text), and ``count(scope, status)``
    records every answer (and :func:`log_refusal` every 4xx). A pure ASGI middleware, so the app reads the client's own channel
    (``Request.is_disconnected`` works inside a handler)."""

    def __init__(self, app: Any, gate: Any, count: Any):
        self.app, self.gate, self.count = app, gate, count

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.gate(scope)
        if refusal is not None:
            self.count(scope, refusal.status_code)
            log_refusal(scope, refusal.status_code, refusal.body)
            return await refusal(scope, receive, send)
        status: list[int] = []
        refused_body = bytearray()

        async def recorded(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body" and status and 400 <= status[0] < 500:
                refused_body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, recorded)
        except Exception as exc:  # noqa: BLE001 - an error object, counted, whatever went wrong
            if status:
                raise  # the answer had started: nothing else can be sent
            response = error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
            await response(scope, receive, send)
            status.append(500)
        self.count(scope, status[0] if status else 500)
        if status:
            log_refusal(scope, status[0], bytes(refused_body))


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """(message, parameter) for the first of pydantic's errors."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    if first.get("type") == "extra_forbidden":
        name = str(first.get("loc", ("",))[-1])
        if name in NOT_IMPLEMENTED:
            return f"the parameter {name!r} is not supported by this server", where
        return f"unknown parameter {where!r}", where
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request body")
    return message, where or None


_ERROR_SCHEMA = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
    "code": {"type": "integer"}}, "required": ["message", "type", "code"]}}, "required": ["error"]}
_ERRORS = {"400": "bad input", "401": "missing or wrong API key", "404": "unknown model", "413": "body over the limit",
           "429": "queue full (see Retry-After)", "500": "generation failed", "503": "loading or draining (see Retry-After)"}


def documented_openapi(app: FastAPI) -> dict:
    """The OpenAPI document with the status codes and content types the server really returns."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version="1", routes=app.routes)
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            if path.startswith("/v1/") and "requestBody" in operation:
                for code, why in _ERRORS.items():
                    responses[code] = {"description": why, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    app.openapi_schema = schema
    return schema


__all__ = ["BodyLimit", "FrontDoor", "validation_message", "documented_openapi", "log_refusal"]
