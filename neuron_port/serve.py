"""OpenAI-compatible HTTP server over a ported model (FastAPI + uvicorn, the ``serve`` extra).

Routes: ``GET /v1/models``, ``GET /health`` (503 while loading or draining), ``GET /metrics``
(Prometheus text), ``POST /v1/completions`` and ``POST /v1/chat/completions`` with
``stream: true`` as server-sent events ending in ``data: [DONE]``. Fields follow vLLM's
OpenAI server: ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` (extra), ``stop``, ``seed``,
``repetition_penalty`` and ``ignore_eos`` (extras), ``usage``, ``finish_reason``. Errors are
OpenAI-style objects ``{"error": {"message", "type", "param", "code"}}``: 400 for bad input
(malformed JSON, wrong types, negative ``max_tokens``, a prompt over the largest bucket), 401
without the bearer token when ``--api-key`` is set, 404 for an unknown model, 429 when the
queue is full, 503 while loading.

Chat prompts use the tokenizer's ``chat_template`` when ``tokenizer_config.json`` has one,
otherwise this Gemma-style default::

    <bos><start_of_turn>user\\n{content}<end_of_turn>\\n ... <start_of_turn>model\\n

(``system`` content is prepended to the first user turn; ``assistant`` turns are ``model``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from neuron_port.engine import Engine, QueueFull, Request
from neuron_port.errors import BucketError
from neuron_port.port import select_bucket
from neuron_port.runtime import GenerationParams, TokenEvent
from neuron_port.sampling import SamplingParams

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


# ---- what the server serves ---------------------------------------------------------------------
@dataclass
class Served:
    """A loaded model: its engine, tokenizer and limits."""

    model_id: str
    engine: Engine
    tokenizer: Any
    vocab_size: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    max_prompt: int
    buckets: list[int]
    chat_template: str | None = None
    end_of_turn_id: int | None = None


@dataclass
class Metrics:
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cancelled: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    latency_count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, seconds: float) -> None:
        with self.lock:
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    self.latency[i] += 1
            self.latency[-1] += 1
            self.latency_sum += seconds
            self.latency_count += 1

    def count(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1


def host_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def render_metrics(m: Metrics, queue_depth: int, running: int) -> str:
    lines = ["# HELP neuron_port_requests_total HTTP requests by route and status.", "# TYPE neuron_port_requests_total counter"]
    for (route, status), n in sorted(m.requests.items()):
        lines.append(f'neuron_port_requests_total{{route="{route}",status="{status}"}} {n}')
    lines += [
        "# TYPE neuron_port_prompt_tokens_total counter", f"neuron_port_prompt_tokens_total {m.prompt_tokens}",
        "# TYPE neuron_port_generated_tokens_total counter", f"neuron_port_generated_tokens_total {m.generated_tokens}",
        "# TYPE neuron_port_cancelled_requests_total counter", f"neuron_port_cancelled_requests_total {m.cancelled}",
        "# HELP neuron_port_request_latency_seconds Time from request to last token.",
        "# TYPE neuron_port_request_latency_seconds histogram",
    ]
    for bound, n in zip(LATENCY_BUCKETS, m.latency):
        lines.append(f'neuron_port_request_latency_seconds_bucket{{le="{bound}"}} {n}')
    lines += [
        f'neuron_port_request_latency_seconds_bucket{{le="+Inf"}} {m.latency[-1]}',
        f"neuron_port_request_latency_seconds_sum {m.latency_sum:.6f}",
        f"neuron_port_request_latency_seconds_count {m.latency_count}",
        "# TYPE neuron_port_queue_depth gauge", f"neuron_port_queue_depth {queue_depth}",
        "# TYPE neuron_port_requests_running gauge", f"neuron_port_requests_running {running}",
        "# TYPE neuron_port_host_rss_bytes gauge", f"neuron_port_host_rss_bytes {host_rss_bytes()}",
    ]
    return "\n".join(lines) + "\n"


# ---- chat template ------------------------------------------------------------------------------
def gemma_chat_prompt(messages: list[dict[str, str]]) -> str:
    """The documented Gemma-style default template (BOS is added separately, as an id)."""
    system = " ".join(m["content"] for m in messages if m["role"] == "system")
    parts = []
    for m in messages:
        if m["role"] == "system":
            continue
        role = "model" if m["role"] == "assistant" else "user"
        content = m["content"]
        if system and role == "user":
            content, system = f"{system}\n\n{content}", ""
        parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
    return "".join(parts) + "<start_of_turn>model\n"


# ---- request schemas ----------------------------------------------------------------------------
class CommonFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(default=None)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: int = 1
    ignore_eos: bool = False
    return_token_ids: bool = False

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v):
        if v is not None and v < 1:
            raise ValueError(f"max_tokens must be at least 1, found {v}")
        return v

    @field_validator("n")
    @classmethod
    def _one(cls, v):
        if v != 1:
            raise ValueError(f"only n=1 is supported, found {v}")
        return v

class CompletionRequest(CommonFields):
    prompt: str | list[int]

class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str

class ChatRequest(CommonFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


# ---- the app ------------------------------------------------------------------------------------
def build_app(load: Callable[[], Served], api_key: str | None = None):
    """A FastAPI app whose model is loaded by ``load`` in a background thread (health 503 until then)."""
    state: dict[str, Any] = {"served": None, "error": None, "draining": False}
    metrics = Metrics()

    app = FastAPI(title="neuron-port OpenAI-compatible server")

    def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": status}})

    @app.exception_handler(RequestValidationError)
    async def _validation(request: HttpRequest, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            metrics.count(request.url.path, 400)
            return error(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}")
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request body")
        metrics.count(request.url.path, 400)
        return error(400, message, param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: HttpRequest, exc: StarletteHTTPException):
        metrics.count(request.url.path, exc.status_code)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind)

    @app.middleware("http")
    async def _auth(request: HttpRequest, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                metrics.count(request.url.path, 401)
                return error(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "authentication_error")
        return await call_next(request)

    def _load() -> None:
        try:
            state["served"] = load()
        except BaseException as exc:  # noqa: BLE001 - reported by /health
            state["error"] = f"{type(exc).__name__}: {exc}"

    threading.Thread(target=_load, name="neuron-port-loader", daemon=True).start()

    @app.get("/health")
    async def health():
        if state["error"]:
            return JSONResponse(status_code=503, content={"status": "failed", "error": state["error"]})
        if state["draining"]:
            return JSONResponse(status_code=503, content={"status": "draining"})
        if state["served"] is None:
            return JSONResponse(status_code=503, content={"status": "loading"})
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_route():
        served = state["served"]
        engine = served.engine if served else None
        text = render_metrics(metrics, engine.queue_depth if engine else 0, engine.running if engine else 0)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def list_models():
        served = state["served"]
        data = [{"id": served.model_id, "object": "model", "created": 0, "owned_by": "neuron-port"}] if served else []
        metrics.count("/v1/models", 200)
        return {"object": "list", "data": data}

    def _ready(route: str) -> tuple[Served | None, JSONResponse | None]:
        served = state["served"]
        if served is None:
            metrics.count(route, 503)
            return None, error(503, "the model is still loading" if not state["error"] else state["error"], "server_error")
        return served, None

    def _params(body: CommonFields, served: Served, chat: bool) -> GenerationParams:
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or 16
        stops = () if body.stop is None else ((body.stop,) if isinstance(body.stop, str) else tuple(body.stop))
        stop_ids = () if body.ignore_eos else served.eos_ids + ((served.end_of_turn_id,) if chat and served.end_of_turn_id is not None else ())
        if stops and served.tokenizer is None:
            raise ValueError("stop strings need a tokenizer, and this model has none")
        return GenerationParams(
            max_new_tokens=max_tokens,
            sampling=SamplingParams(body.temperature, max(0, body.top_k), body.top_p, body.repetition_penalty),
            seed=body.seed,
            stop_token_ids=stop_ids,
            stop_strings=stops,
        )

    def _encode(served: Served, text: str) -> list[int]:
        if served.tokenizer is None:
            raise ValueError("this model has no tokenizer: send the prompt as a list of token ids")
        return ([served.bos_id] if served.bos_id is not None else []) + served.tokenizer.encode(text).ids

    async def _run(route: str, body: CommonFields, prompt_ids: list[int], served: Served, http: HttpRequest, chat: bool):
        if body.model != served.model_id:
            metrics.count(route, 404)
            return error(404, f"the model {body.model!r} does not exist; this server serves {served.model_id!r}",
                         "not_found_error", "model")
        if not prompt_ids:
            metrics.count(route, 400)
            return error(400, "the prompt is empty", param="prompt")
        bad = [t for t in prompt_ids if not 0 <= t < served.vocab_size]
        if bad:
            metrics.count(route, 400)
            return error(400, f"token id {bad[0]} is outside the vocabulary (0..{served.vocab_size - 1})", param="prompt")
        try:
            select_bucket(len(prompt_ids), served.buckets)
            params = _params(body, served, chat)
        except (BucketError, ValueError) as exc:
            metrics.count(route, 400)
            return error(400, str(exc), param="prompt" if isinstance(exc, BucketError) else None)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = Request(prompt_ids, params, lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev))
        try:
            served.engine.submit(req)
        except QueueFull as exc:
            metrics.count(route, 429)
            return error(429, str(exc), "rate_limit_error")
        metrics.prompt_tokens += len(prompt_ids)
        started = time.monotonic()
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())

        def usage(n: int) -> dict:
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": n, "total_tokens": len(prompt_ids) + n}

        async def events():
            while True:
                ev = await queue.get()
                if ev is None:
                    return
                if isinstance(ev, BaseException):
                    raise ev
                yield ev

        if body.stream:
            async def sse():
                n, reason = 0, None
                try:
                    if chat:
                        yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": served.model_id,
                                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
                    async for ev in events():
                        n += 1
                        metrics.generated_tokens += 1
                        reason = ev.finish_reason if ev.finish_reason != "cancelled" else None
                        yield _sse(_chunk(rid, created, served.model_id, chat, ev, reason, body.return_token_ids))
                    metrics.observe(time.monotonic() - started)
                    metrics.count(route, 200)
                    yield _sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                                "model": served.model_id, "choices": [], "usage": usage(n)})
                    yield "data: [DONE]\n\n"
                finally:
                    if reason is None:
                        req.cancelled.set()  # the client went away mid-stream: free its slot
                        metrics.cancelled += 1

            return StreamingResponse(sse(), media_type="text/event-stream")

        text, ids, reason = "", [], "length"
        try:
            async for ev in events():
                text += ev.text
                ids.append(ev.token_id)
                metrics.generated_tokens += 1
                reason = ev.finish_reason or reason
        except asyncio.CancelledError:
            req.cancelled.set()
            metrics.cancelled += 1
            raise
        metrics.observe(time.monotonic() - started)
        metrics.count(route, 200)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if body.return_token_ids:
            choice["token_ids"] = ids
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": served.model_id, "choices": [choice], "usage": usage(len(ids))}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest):
        served, err = _ready("/v1/completions")
        if err:
            return err
        try:
            ids = body.prompt if isinstance(body.prompt, list) else _encode(served, body.prompt)
        except ValueError as exc:
            metrics.count("/v1/completions", 400)
            return error(400, str(exc), param="prompt")
        return await _run("/v1/completions", body, list(ids), served, http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, http: HttpRequest):
        served, err = _ready("/v1/chat/completions")
        if err:
            return err
        messages = [m.model_dump() for m in body.messages]
        try:
            if served.chat_template:
                from jinja2 import Template

                text = Template(served.chat_template).render(messages=messages, add_generation_prompt=True, bos_token="")
            else:
                text = gemma_chat_prompt(messages)
            ids = _encode(served, text)
        except ValueError as exc:
            metrics.count("/v1/chat/completions", 400)
            return error(400, str(exc), param="messages")
        return await _run("/v1/chat/completions", body, ids, served, http, chat=True)

    app.state.neuron_port = state
    return app


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _chunk(rid: str, created: int, model: str, chat: bool, ev: TokenEvent, reason: str | None, with_ids: bool) -> dict:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": ev.text}, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": ev.text, "finish_reason": reason, "logprobs": None}
    if with_ids:
        choice["token_ids"] = [ev.token_id]
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice]}


# ---- loading ------------------------------------------------------------------------------------
def load_served(target: str, tiny: bool = False, seed: int = 0, slim: bool = False, max_batch: int = 4,
                max_queue: int = 64, buckets=(32, 64, 128), kv_lens=(256, 512)) -> Served:
    """A model name, model directory or artifact directory, ready to serve.

    Artifacts always run slim (compiled graphs + embeddings only). ``slim`` on a model compiles
    TorchScript graphs for ``max_batch`` rows and drops the Hugging Face model from the host.
    """
    import copy
    from pathlib import Path

    from neuron_port.layout import describe
    from neuron_port.port import Port
    from neuron_port.runtime import Generator
    from neuron_port.tokenizer import load_tokenizer

    path = Path(target)
    if (path / "manifest.json").exists():
        from neuron_port.artifact import verify
        from neuron_port.compiled import load_port
        from neuron_port.configs import load_config

        manifest = verify(path)
        port = load_port(path, manifest=manifest)
        config = load_config(path / "config.json")
        fixed = int(manifest["batch"])
        tokenizer = load_tokenizer(path)
        chat_template = _chat_template(path)
    else:
        from neuron_port.models import model_from_name

        model = model_from_name(target, tiny=tiny, seed=seed)
        config = model.config  # a text CausalLM's own config
        port = Port(copy.deepcopy(model), describe(model), list(buckets), list(kv_lens))
        del model
        fixed = None
        if slim:
            from neuron_port.backends import get_backend

            port.compile(get_backend("cpu"), batch=max_batch)
            port.prefill_graphs, port.decode_graphs = {}, {}
            fixed = max_batch
        if path.is_dir():
            tokenizer, chat_template = load_tokenizer(path), _chat_template(path)
        elif tiny:
            from neuron_port.localdir import build_tokenizer

            tokenizer, chat_template = build_tokenizer(port.layout.vocab_size), None
        else:
            tokenizer, chat_template = None, None
    from neuron_port.families import family_for

    family = family_for(config.model_type)
    special = family.special_ids(config)
    eot = tokenizer.token_to_id("<end_of_turn>") if tokenizer is not None else None
    pad = special.bos if special.bos is not None else (special.pad or 0)
    engine = Engine(Generator(port, tokenizer=tokenizer), max_batch=max_batch, max_queue=max_queue, fixed_batch=fixed,
                    pad_prompt=(pad,))
    name = path.name if path.is_dir() else target
    return Served(name, engine, tokenizer, family.vocab_size(config), special.bos, special.eos,
                  max(port.buckets), port.buckets, chat_template, eot)


def _chat_template(directory) -> str | None:
    from pathlib import Path

    cfg = Path(directory) / "tokenizer_config.json"
    if cfg.exists():
        try:
            return json.loads(cfg.read_text()).get("chat_template")
        except json.JSONDecodeError:
            return None
    return None


def serve(app, host: str = "127.0.0.1", port: int = 8000) -> None:
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


__all__ = ["Served", "build_app", "load_served", "serve", "gemma_chat_prompt", "render_metrics"]
