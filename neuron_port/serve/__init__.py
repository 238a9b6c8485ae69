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

from importlib import import_module
from typing import Any

# Imported on first use: the engines (serve.engine, serve.lockstep) run without the serve extra, and
# importing one of them must not import FastAPI through this package.
_PUBLIC = {
    "ServerApp": "neuron_port.serve.app", "build_app": "neuron_port.serve.app", "serve": "neuron_port.serve.app",
    "ChatFormat": "neuron_port.generation.chat", "chat_format": "neuron_port.generation.chat",
    "Served": "neuron_port.serve.loading", "load_served": "neuron_port.serve.loading",
    "Metrics": "neuron_port.serve.metrics", "render_metrics": "neuron_port.serve.metrics",
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'neuron_port.serve' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


__all__ = sorted(_PUBLIC)
