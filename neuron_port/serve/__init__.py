"""OpenAI-compatible HTTP server over a ported model (FastAPI + uvicorn, the ``serve`` extra).

* :mod:`~neuron_port.serve.app` — the app (:class:`ServerApp`): routes, auth, drain; :func:`serve`;
* :mod:`~neuron_port.serve.http` — the body limit, validation messages, the OpenAPI document;
* :mod:`~neuron_port.serve.schemas` — request bodies;
* :mod:`~neuron_port.serve.admission` — each request checked and tokenized before it is queued;
* :mod:`~neuron_port.serve.reply` — the engine's events as an OpenAI response, whole or streamed;
* :mod:`~neuron_port.serve.metrics` — Prometheus metrics;
* :mod:`~neuron_port.serve.loading` — a model name, model directory or artifact, loaded into an engine.

Fields follow OpenAI (``n``, ``logprobs``/``top_logprobs``, ``stop``, ``seed``, penalties,
``logit_bias``, ``max_completion_tokens``, ``stream_options``, chat content parts) with vLLM's
extras (``top_k``, ``repetition_penalty``, ``ignore_eos``, ``return_token_ids``). Requests are
decoded with continuous batching (:mod:`neuron_port.generation.slots`).
"""

from __future__ import annotations

from neuron_port.serve.app import ServerApp, build_app, serve
from neuron_port.generation.chat import ChatFormat, chat_format
from neuron_port.serve.loading import Served, load_served
from neuron_port.serve.metrics import Metrics, render_metrics

__all__ = ["ServerApp", "Served", "ChatFormat", "Metrics", "build_app", "load_served", "serve", "chat_format",
           "render_metrics"]
