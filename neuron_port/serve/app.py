"""The OpenAI-compatible HTTP app: routes, errors, auth, streaming; and ``serve`` to run it.

Routes: ``GET /v1/models``, ``GET /health`` (503 while loading or draining), ``GET /metrics``
(Prometheus text), ``POST /v1/completions`` and ``POST /v1/chat/completions`` with
``stream: true`` as server-sent events ending in ``data: [DONE]``. Errors are OpenAI-style
objects ``{"error": {"message", "type", "param", "code"}}``: 400 for bad input (malformed JSON,
wrong types, negative ``max_tokens``, a prompt over the largest bucket), 401 without the
bearer token when an API key is set, 404 for an unknown model, 429 when the queue is full,
503 while loading.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from neuron_port.engine import QueueFull, Request
from neuron_port.errors import BucketError
from neuron_port.runtime import GenerationParams, TokenEvent
from neuron_port.sampling import SamplingParams
from neuron_port.serve.loading import Served
from neuron_port.serve.metrics import Metrics, render_metrics
from neuron_port.serve.schemas import ChatRequest, CommonFields, CompletionRequest
from neuron_port.shapes import select_bucket

DEFAULT_MAX_TOKENS = 16


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": status}})


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class _Rejected(Exception):
    """A request refused before it reaches the engine (status, message, error type, param)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.response = error(status, message, kind, param)


class ServerApp:
    """The server's state (the model once loaded, drain flag, metrics) and its routes.

    ``load`` runs in a background thread; ``/health`` answers 503 until it is done.
    """

    def __init__(self, load: Callable[[], Served], api_key: str | None = None):
        self.api_key = api_key
        self.metrics = Metrics()
        self.state: dict[str, Any] = {"served": None, "error": None, "draining": False}
        self.app = FastAPI(title="neuron-port OpenAI-compatible server")
        self.app.state.neuron_port = self.state
        self._register()
        threading.Thread(target=self._load, args=(load,), name="neuron-port-loader", daemon=True).start()

    def _load(self, load: Callable[[], Served]) -> None:
        try:
            self.state["served"] = load()
        except BaseException as exc:  # noqa: BLE001 - reported by /health
            self.state["error"] = f"{type(exc).__name__}: {exc}"

    def _register(self) -> None:
        app = self.app
        app.add_exception_handler(RequestValidationError, self.on_validation_error)
        app.add_exception_handler(StarletteHTTPException, self.on_http_error)
        app.middleware("http")(self.check_auth)
        app.get("/health")(self.health)
        app.get("/metrics")(self.metrics_page)
        app.get("/v1/models")(self.list_models)

        async def completions(body: CompletionRequest):
            return await self.complete("/v1/completions", body, chat=False)

        async def chat_completions(body: ChatRequest):
            return await self.complete("/v1/chat/completions", body, chat=True)

        app.post("/v1/completions")(completions)
        app.post("/v1/chat/completions")(chat_completions)

    # ---- errors and auth -------------------------------------------------------------------
    async def on_validation_error(self, request: HttpRequest, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        self.metrics.count(request.url.path, 400)
        if first.get("type") == "json_invalid":
            return error(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}")
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request body")
        return error(400, message, param=where or None)

    async def on_http_error(self, request: HttpRequest, exc: StarletteHTTPException):
        self.metrics.count(request.url.path, exc.status_code)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind)

    async def check_auth(self, request: HttpRequest, call_next):
        if self.api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization", "") != f"Bearer {self.api_key}":
                self.metrics.count(request.url.path, 401)
                return error(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "authentication_error")
        return await call_next(request)

    # ---- plain routes ------------------------------------------------------------------------
    async def health(self):
        if self.state["error"]:
            return JSONResponse(status_code=503, content={"status": "failed", "error": self.state["error"]})
        if self.state["draining"]:
            return JSONResponse(status_code=503, content={"status": "draining"})
        if self.state["served"] is None:
            return JSONResponse(status_code=503, content={"status": "loading"})
        return {"status": "ok"}

    async def metrics_page(self):
        served = self.state["served"]
        engine = served.engine if served else None
        text = render_metrics(self.metrics, engine.queue_depth if engine else 0, engine.running if engine else 0)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def list_models(self):
        served = self.state["served"]
        data = [{"id": served.model_id, "object": "model", "created": 0, "owned_by": "neuron-port"}] if served else []
        self.metrics.count("/v1/models", 200)
        return {"object": "list", "data": data}

    # ---- completions -------------------------------------------------------------------------
    async def complete(self, route: str, body: CommonFields, chat: bool):
        """Validate, queue and answer one completion request (streamed or whole)."""
        try:
            served = self._ready()
            prompt_ids = self._prompt(served, body, chat)
            params = self._params(body, served, chat)
            req, queue = self._submit(served, prompt_ids, params)
        except _Rejected as rejected:
            self.metrics.count(route, rejected.response.status_code)
            return rejected.response
        self.metrics.prompt_tokens += len(prompt_ids)
        reply = _Reply(self, route, served, body, chat, req, queue, len(prompt_ids))
        if body.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream")
        return await reply.whole()

    def _ready(self) -> Served:
        served = self.state["served"]
        if served is None:
            raise _Rejected(503, "the model is still loading" if not self.state["error"] else self.state["error"], "server_error")
        return served

    def _prompt(self, served: Served, body: CommonFields, chat: bool) -> list[int]:
        """The request's prompt ids, checked against the model and the buckets."""
        if body.model != served.model_id:
            raise _Rejected(404, f"the model {body.model!r} does not exist; this server serves {served.model_id!r}",
                            "not_found_error", "model")
        param = "messages" if chat else "prompt"
        try:
            if chat:
                ids = served.encode(served.chat.render([m.model_dump() for m in body.messages]))
            else:
                ids = list(body.prompt) if isinstance(body.prompt, list) else served.encode(body.prompt)
        except ValueError as exc:
            raise _Rejected(400, str(exc), param=param) from None
        if not ids:
            raise _Rejected(400, "the prompt is empty", param="prompt")
        bad = [t for t in ids if not 0 <= t < served.vocab_size]
        if bad:
            raise _Rejected(400, f"token id {bad[0]} is outside the vocabulary (0..{served.vocab_size - 1})", param="prompt")
        try:
            select_bucket(len(ids), served.buckets)
        except BucketError as exc:
            raise _Rejected(400, str(exc), param="prompt") from None
        return ids

    def _params(self, body: CommonFields, served: Served, chat: bool) -> GenerationParams:
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or DEFAULT_MAX_TOKENS
        stops = () if body.stop is None else ((body.stop,) if isinstance(body.stop, str) else tuple(body.stop))
        stop_ids = () if body.ignore_eos else tuple(dict.fromkeys(served.eos_ids + (served.chat.stop_ids if chat else ())))
        if stops and served.tokenizer is None:
            raise _Rejected(400, "stop strings need a tokenizer, and this model has none")
        try:
            return GenerationParams(
                max_new_tokens=max_tokens,
                sampling=SamplingParams(body.temperature, max(0, body.top_k), body.top_p, body.repetition_penalty),
                seed=body.seed, stop_token_ids=stop_ids, stop_strings=stops)
        except ValueError as exc:
            raise _Rejected(400, str(exc)) from None

    def _submit(self, served: Served, prompt_ids: list[int], params: GenerationParams) -> tuple[Request, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = Request(prompt_ids, params, lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev))
        try:
            served.engine.submit(req)
        except QueueFull as exc:
            raise _Rejected(429, str(exc), "rate_limit_error") from None
        return req, queue


class _Reply:
    """One accepted request's answer: events from the engine turned into an OpenAI response."""

    def __init__(self, server: ServerApp, route: str, served: Served, body: CommonFields, chat: bool, req: Request,
                 queue: asyncio.Queue, prompt_tokens: int):
        self.server, self.metrics, self.route, self.served = server, server.metrics, route, served
        self.body, self.chat, self.req, self.queue, self.prompt_tokens = body, chat, req, queue, prompt_tokens
        self.rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.started = time.monotonic()
        self.kind = ("chat.completion" if chat else "text_completion")

    def usage(self, n: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}

    async def events(self) -> AsyncIterator[TokenEvent]:
        while True:
            ev = await self.queue.get()
            if ev is None:
                return
            if isinstance(ev, BaseException):
                raise ev
            yield ev

    def _done(self) -> None:
        self.metrics.observe(time.monotonic() - self.started)
        self.metrics.count(self.route, 200)

    async def stream(self) -> AsyncIterator[str]:
        n, reason = 0, None
        chunk_kind = "chat.completion.chunk" if self.chat else "text_completion"
        try:
            if self.chat:
                yield _sse({"id": self.rid, "object": chunk_kind, "created": self.created, "model": self.served.model_id,
                            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
            async for ev in self.events():
                n += 1
                self.metrics.generated_tokens += 1
                reason = ev.finish_reason if ev.finish_reason != "cancelled" else None
                yield _sse(self.chunk(ev, reason))
            self._done()
            yield _sse({"id": self.rid, "object": chunk_kind, "created": self.created, "model": self.served.model_id,
                        "choices": [], "usage": self.usage(n)})
            yield "data: [DONE]\n\n"
        finally:
            if reason is None:
                self.req.cancelled.set()  # the client went away mid-stream: free its slot
                self.metrics.cancelled += 1

    def chunk(self, ev: TokenEvent, reason: str | None) -> dict:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": ev.text}, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": ev.text, "finish_reason": reason, "logprobs": None}
        if self.body.return_token_ids:
            choice["token_ids"] = [ev.token_id]
        return {"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.served.model_id, "choices": [choice]}

    async def whole(self) -> dict:
        text, ids, reason = "", [], "length"
        try:
            async for ev in self.events():
                text += ev.text
                ids.append(ev.token_id)
                self.metrics.generated_tokens += 1
                reason = ev.finish_reason or reason
        except asyncio.CancelledError:
            self.req.cancelled.set()
            self.metrics.cancelled += 1
            raise
        self._done()
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.body.return_token_ids:
            choice["token_ids"] = ids
        return {"id": self.rid, "object": self.kind, "created": self.created, "model": self.served.model_id,
                "choices": [choice], "usage": self.usage(len(ids))}


def build_app(load: Callable[[], Served], api_key: str | None = None) -> FastAPI:
    """A FastAPI app whose model is loaded by ``load`` in a background thread (health 503 until then)."""
    return ServerApp(load, api_key).app


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run with uvicorn. SIGTERM marks the server draining (health 503), stops accepting, lets
    in-flight requests finish, then exits with status 0 (it is not re-raised after the drain)."""
    import signal

    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):
            app.state.neuron_port["draining"] = True
            if sig == signal.SIGTERM:
                self.should_exit = True
                return
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=60)
    DrainingServer(config).run()


__all__ = ["ServerApp", "build_app", "serve", "error"]
