"""HTTP-level pieces of the server: the request-body limit, validation messages, the OpenAPI document.

* :class:`BodyLimit`: an ASGI middleware that answers 413 to a body over the limit — at once when
  ``Content-Length`` says so (the body is never read), or as soon as a chunked body passes it.
* :func:`validation_message`: pydantic's first error as one line naming the parameter; an unknown
  parameter, or one OpenAI defines that this server does not implement, says exactly that.
* :func:`documented_openapi`: the schema FastAPI generates, corrected to what the server does:
  400 (not 422) with the error object, and 401, 404, 413, 429, 503.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from neuron_port.serve.reply import error
from neuron_port.serve.schemas import NOT_IMPLEMENTED


class BodyLimit:
    """413 for request bodies over ``limit`` bytes."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    def _too_large(self) -> Any:
        return error(413, f"the request body is larger than the server's limit of {self.limit} bytes", param="body")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large()(scope, receive, send)
        seen, over = 0, False

        async def counted() -> dict:
            nonlocal seen, over
            if over:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def guarded(message: dict) -> None:
            if not over:
                await send(message)

        await self.app(scope, counted, guarded)
        if over:
            await self._too_large()(scope, receive, send)


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


__all__ = ["BodyLimit", "validation_message", "documented_openapi"]
