"""``serve``: the OpenAI-compatible HTTP server over a model name, model directory or artifact."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from neuron_port.artifacts.manifest import MANIFEST
from neuron_port.cli.commands.common import (
    MODEL_HELP,
    add_dtype_option,
    add_model_source_options,
    add_speculation_options,
    int_list,
)
from neuron_port.cli.quant_flags import add_quant_option
from neuron_port.errors import MissingExtraError


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from neuron_port.serve import build_app, load_served, serve
        from neuron_port.serve.loading import artifact_drafts, check_speculation
    except ImportError as exc:  # pragma: no cover - the serve extra is missing
        raise MissingExtraError(f"serving needs the 'serve' extra: pip install 'neuron-port[serve]' ({exc})") from None

    import torch

    check_speculation(args.speculate, args.draft, args.draft_tokens, args.tiny, args.slim,  # before the server starts
                      artifact_drafts(args.model) if Path(args.model, MANIFEST).exists() else None)
    threads = args.threads or default_threads()
    torch.set_num_threads(threads)  # before the model loads: every graph runs with it
    print(f"neuron-port: {threads} torch thread{'s' if threads > 1 else ''} (--threads)", file=sys.stderr)
    load = functools.partial(load_served, args.model, tiny=args.tiny, seed=args.seed, slim=args.slim,
                             max_batch=args.max_batch, max_queue=args.max_queue, buckets=tuple(args.buckets),
                             kv_lens=tuple(args.kv_lens), batching=args.batching, dtype=args.dtype,
                             quant=args.quant, model_id=served_name(args), speculate=args.speculate,
                             draft_tokens=args.draft_tokens, draft=args.draft)
    try:
        serve(build_app(load, api_key=args.api_key, max_body_bytes=args.max_body_bytes), host=args.host, port=args.port,
              log_level=args.log_level, model_name=getattr(args, "model_as_given", args.model))
    except KeyboardInterrupt:  # Ctrl-C before the server took over its signals
        print("neuron-port: stopped", file=sys.stderr)
    return 0


def default_threads(cores: int | None = None) -> int:
    """Torch threads for the server's graphs: every core this process may use but one, which is left to the
    HTTP side (the event loop, tokenizing, and a load tool on the same host); at least one. On a 2-core host a
    second torch thread competing with the event loop and the client more than doubled the time between tokens."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def _threads(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 thread, found {value}")
    return value


def served_name(args: argparse.Namespace) -> str | None:
    """The model name clients send: ``--served-model-name``, else a Hugging Face id as given (not its snapshot
    directory's commit), else None (the loader's default: a directory's name, a shipped name)."""
    if args.served_model_name:
        return args.served_model_name
    given = getattr(args, "model_as_given", args.model)
    return given if given != args.model else None


def add(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the 'serve' extra)")
    p.add_argument("model", help=MODEL_HELP + "; or an artifact directory")
    p.add_argument("--tiny", action="store_true", help="random weights on the tiny variant of a config")
    add_model_source_options(p, weights=True)
    p.add_argument("--seed", type=int, default=0, help="seed of random weights (--tiny, --random-weights)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level; info and debug add an access log line per request")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients give in 'model' (default: a Hugging Face id as given, a directory's name, or "
                        "the shipped name)")
    p.add_argument("--slim", action="store_true", help="keep only embeddings and compiled graphs on the host")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests beyond this get 429")
    p.add_argument("--max-batch", type=int, default=4, help="requests decoded together (the continuous engine's slots)")
    p.add_argument("--batching", default="continuous", choices=["continuous", "static"],
                   help="continuous: requests join free slots at every step; static: whole batches (for comparison)")
    p.add_argument("--threads", type=_threads, default=None,
                   help="torch threads running the graphs (default: the cores this process may use, less one left to "
                        "the HTTP side)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger request bodies get 413")
    p.add_argument("--buckets", type=int_list, default=[32, 64, 128],
                   help="prompt buckets of a model built here: the longest is the longest prompt served")
    p.add_argument("--kv-lens", type=int_list, default=[256, 512],
                   help="KV lengths of a model built here: the longest is the context (prompt + new tokens)")
    add_dtype_option(p, "of a model's graphs, weights and KV store (an artifact keeps the dtype it was compiled in)")
    add_quant_option(p)
    add_speculation_options(p, "assistant on a model without --slim; ngram on an artifact compiled with --draft-tokens")
    p.set_defaults(func=_cmd_serve)


__all__ = ["add", "default_threads"]
