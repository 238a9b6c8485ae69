"""OpenAI-compatible HTTP server over a ported model (FastAPI + uvicorn, the ``serve`` extra).

* :mod:`~neuron_port.serve.app` — the app (:class:`ServerApp`): routes, errors, auth, SSE; :func:`serve`;
* :mod:`~neuron_port.serve.schemas` — request bodies;
* :mod:`~neuron_port.serve.metrics` — Prometheus metrics;
* :mod:`~neuron_port.serve.chat` — chat prompts and stop tokens from the model's own files;
* :mod:`~neuron_port.serve.loading` — a model name, model directory or artifact, loaded into an engine.

Fields follow vLLM's OpenAI server: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``
(extra), ``stop``, ``seed``, ``repetition_penalty`` and ``ignore_eos`` (extras), ``usage``,
``finish_reason``.
"""

from __future__ import annotations

from neuron_port.serve.app import ServerApp, build_app, serve
from neuron_port.serve.chat import ChatFormat, chat_format, gemma_chat_prompt
from neuron_port.serve.loading import Served, load_served
from neuron_port.serve.metrics import Metrics, render_metrics

__all__ = ["ServerApp", "Served", "ChatFormat", "Metrics", "build_app", "load_served", "serve", "chat_format",
           "gemma_chat_prompt", "render_metrics"]
