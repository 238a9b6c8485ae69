"""The OpenAI-compatible HTTP app: routes, errors, auth, limits, metrics; and ``serve`` to run it.

Routes: ``GET /v1/models``, ``GET``/``HEAD /health`` (503 while loading or draining),
``GET``/``HEAD /metrics`` (Prometheus text, with vLLM's time-to-first-token and inter-token
histograms), ``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream: true`` as
server-sent events ending in ``data: [DONE]``). Errors are OpenAI-style objects
``{"error": {"message", "type", "param", "code"}}``: 400 for bad input (malformed JSON, wrong
types, unknown or unsupported parameters, a prompt over the largest bucket, more tokens than the
context), 401 without the bearer token when an API key is set, 404 for an unknown model, 413 for
a body over the limit, 429 with ``Retry-After`` when the queue is full, 500 when generation
fails (that request alone), 503 with ``Retry-After`` while loading or draining.

Nothing slow runs on the event loop: a request is checked and tokenized in a worker thread
(:mod:`neuron_port.serve.admission`), and the engine decodes on its own thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from neuron_port.errors import NeuronPortError, QueueFull, Rejected, ServeError
from neuron_port.serve.admission import admit
from neuron_port.serve.engine import Submission
from neuron_port.serve.http import BodyLimit, FrontDoor, documented_openapi, validation_message
from neuron_port.serve.loading import Served
from neuron_port.serve.metrics import UNMATCHED, Metrics, render_metrics, route_label
from neuron_port.serve.reply import Reply, error
from neuron_port.serve.schemas import ChatRequest, CommonFields, CompletionRequest

DEFAULT_BODY_LIMIT = 4 * 1024 * 1024
RETRY_AFTER_S = "1"


class ServerApp:
    """The server's state (the model once loaded, drain flag, metrics) and its routes.

    ``load`` runs in a background thread; ``/health`` answers 503 until it is done.
    """

    def __init__(self, load: Callable[[], Served], api_key: str | None = None, max_body_bytes: int = DEFAULT_BODY_LIMIT):
        self.api_key = api_key
        self.metrics = Metrics()
        self.state: dict[str, Any] = {"served": None, "error": None, "draining": False}
        self.app = FastAPI(title="neuron-port OpenAI-compatible server")
        self.app.state.neuron_port = self.state
        self._register()
        self.app.add_middleware(FrontDoor, gate=self.gate, count=lambda scope, status: self.metrics.count(
            self._label(scope), status))
        self.app.add_middleware(BodyLimit, limit=max_body_bytes,
                                count=lambda scope, status: self.metrics.count(self._label(scope), status))
        self.app.openapi = lambda: documented_openapi(self.app)
        threading.Thread(target=self._load, args=(load,), name="neuron-port-loader", daemon=True).start()

    def _label(self, scope: dict) -> str:
        """The metrics label of a request: the route that matched, else its path when it names a route
        (answered before routing: 401, 413, 503), else ``unmatched``."""
        label = route_label(scope)
        if label == UNMATCHED and scope.get("path") in {getattr(route, "path", None) for route in self.app.routes}:
            return scope["path"]
        return label

    def _load(self, load: Callable[[], Served]) -> None:
        try:
            self.state["served"] = load()
        except BaseException as exc:  # noqa: BLE001 - reported by /health
            self.state["error"] = f"{type(exc).__name__}: {exc}"

    def _register(self) -> None:
        app = self.app
        app.add_exception_handler(RequestValidationError, self.on_validation_error)
        app.add_exception_handler(StarletteHTTPException, self.on_http_error)
        app.api_route("/health", methods=["GET", "HEAD"])(self.health)  # HEAD: load balancers' probes
        app.api_route("/metrics", methods=["GET", "HEAD"])(self.metrics_page)
        app.get("/v1/models")(self.list_models)

        async def completions(body: CompletionRequest, http: HttpRequest):
            return await self.complete(body, http, chat=False)

        async def chat_completions(body: ChatRequest, http: HttpRequest):
            return await self.complete(body, http, chat=True)

        for path, route in (("/v1/completions", completions), ("/v1/chat/completions", chat_completions)):
            app.post(path, responses={200: {"content": {"application/json": {}, "text/event-stream": {}}}})(route)

    # ---- every request: auth and drain first (FrontDoor also counts and catches) ---------------------
    def gate(self, scope: dict) -> JSONResponse | None:
        """The answer a ``/v1`` request gets before any route runs, or None to let it through."""
        if not scope.get("path", "").startswith("/v1/"):
            return None
        headers = dict(scope.get("headers") or [])
        if self.api_key and headers.get(b"authorization", b"").decode("latin-1") != f"Bearer {self.api_key}":
            return error(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "authentication_error")
        if self.state["draining"]:
            return error(503, "the server is shutting down; retry on another replica", "server_error",
                         headers={"Retry-After": RETRY_AFTER_S})
        return None

    async def on_validation_error(self, request: HttpRequest, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return error(400, message, param=param)

    async def on_http_error(self, request: HttpRequest, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind)

    # ---- plain routes ------------------------------------------------------------------------
    async def health(self):
        served = self.state["served"]
        failure = self.state["error"] or (served.engine.error if served is not None else None)
        if failure:
            return JSONResponse(status_code=503, content={"status": "failed", "error": failure})
        if self.state["draining"]:
            return JSONResponse(status_code=503, content={"status": "draining"})
        if self.state["served"] is None:
            return JSONResponse(status_code=503, content={"status": "loading"})
        return {"status": "ok"}

    async def metrics_page(self):
        served = self.state["served"]
        engine = served.engine if served else None
        text = render_metrics(self.metrics, engine.queue_depth if engine else 0, engine.running if engine else 0,
                              served.model_id if served else "")
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def list_models(self):
        served = self.state["served"]
        data = [{"id": served.model_id, "object": "model", "created": 0, "owned_by": "neuron-port"}] if served else []
        return {"object": "list", "data": data}

    # ---- completions -------------------------------------------------------------------------
    async def complete(self, body: CommonFields, http: HttpRequest, chat: bool):
        """Check (off the loop), queue one engine request per choice, and answer (streamed or whole)."""
        arrived = time.monotonic()
        served = self.state["served"]
        if served is None:
            return error(503, self.state["error"] or "the model is still loading", "server_error",
                         headers={"Retry-After": RETRY_AFTER_S})
        try:
            admitted = await asyncio.to_thread(admit, served, body, chat)
        except Rejected as rejected:
            return error(rejected.status, rejected.message, rejected.kind, rejected.param)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        requests = [Submission(prompt, params, lambda ev, i=i: loop.call_soon_threadsafe(queue.put_nowait, (i, ev)))
                    for i, (prompt, params) in enumerate(admitted.choices)]
        try:
            served.engine.submit_all(requests)  # every choice or none
        except QueueFull as exc:
            return error(429, str(exc), "rate_limit_error", headers={"Retry-After": RETRY_AFTER_S})
        except NeuronPortError as exc:  # the engine stopped
            return error(503, str(exc), "server_error")
        self.metrics.add("prompt_tokens", sum(len(p) for p in admitted.prompts))
        usage_chunks = body.stream_options.usage_chunks() if body.stream_options else "none"
        reply = Reply(served, self.metrics, chat, requests, queue, admitted.prompts, admitted.logprobs,
                      body.return_token_ids, usage_chunks, admitted.echo, arrived)
        if body.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream")
        return await reply.whole(http.is_disconnected)


def build_app(load: Callable[[], Served], api_key: str | None = None, max_body_bytes: int = DEFAULT_BODY_LIMIT) -> FastAPI:
    """A FastAPI app whose model is loaded by ``load`` in a background thread (health 503 until then)."""
    return ServerApp(load, api_key, max_body_bytes).app


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def ready_line(served: Served, host: str, port: int) -> str:
    """What the server says once its model is loaded: where, what, and the limits a client meets."""
    return (f"neuron-port: serving {served.model_id} on http://{host}:{port} (OpenAI API under /v1): "
            f"{served.engine.max_batch} slots, prompts up to {served.max_prompt} tokens (buckets {served.buckets}), "
            f"context {served.kv_len}" + (f", speculative decoding ({served.speculation})" if served.speculation else ""))


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 60.0,
          log_level: str = "info", model_name: str | None = None) -> None:
    """Run with uvicorn, as uvicorn and vLLM behave: a line when the model starts loading and one when it is
    served (address, model, limits), an access log at ``log_level`` ``info`` and below, and a drain on
    SIGTERM or the first Ctrl-C: health and new ``/v1`` requests answer 503 (with ``Retry-After``) while the
    requests already accepted finish, then the server returns (a second Ctrl-C stops at once). A model that
    fails to load stops the server at once: :class:`~neuron_port.errors.ServeError`, one line."""
    import logging
    import signal

    import uvicorn

    if log_level not in LOG_LEVELS:
        raise ServeError(f"log level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    state = app.state.neuron_port
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level in ("info", "debug"),
                            timeout_graceful_shutdown=drain_timeout_s)  # sets up uvicorn's loggers
    log = logging.getLogger("uvicorn.error")

    def drained() -> bool:
        served = state["served"]
        return served is None or served.engine.idle

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if sig not in (signal.SIGTERM, signal.SIGINT) or state["draining"]:
                return super().handle_exit(sig, frame)  # a second signal: uvicorn stops now
            state["draining"] = True  # not passed on: uvicorn would raise the signal again once it stops
            log.info("neuron-port: draining (%s): finishing the requests already accepted, refusing new ones",
                     signal.Signals(sig).name)

            def wait_then_exit() -> None:
                deadline = time.monotonic() + drain_timeout_s
                while not drained() and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(0.2)  # the last events reach their streams
                self.should_exit = True

            threading.Thread(target=wait_then_exit, name="neuron-port-drain", daemon=True).start()

    server = DrainingServer(config)
    failed: list[str] = []

    def announce() -> None:
        while state["served"] is None and state["error"] is None:
            time.sleep(0.05)
        if state["error"] is not None:
            failed.append(state["error"])
            server.should_exit = True  # nothing to serve: stop rather than answer 503 for ever
        else:
            log.info(ready_line(state["served"], host, port))

    log.info("neuron-port: loading %s", model_name or "the model")
    threading.Thread(target=announce, name="neuron-port-announce", daemon=True).start()
    server.run()
    if state["served"] is not None:
        state["served"].engine.close()  # a tensor-parallel artifact's follower ranks leave with it
    if failed:
        reason = " ".join(failed[0].split())
        raise ServeError(f"could not load {model_name or 'the model'}: {reason}")


__all__ = ["ServerApp", "build_app", "serve", "ready_line", "LOG_LEVELS", "DEFAULT_BODY_LIMIT"]
