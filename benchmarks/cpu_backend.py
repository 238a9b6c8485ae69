"""CPU backends against each other: eager graphs, traced graphs, traced graphs with the passes.

Same static graphs, same inputs, same store; only the backend differs:

* ``eager``: the graph modules run as Python (``cpu-eager``);
* ``compiled_torchscript_unoptimized``: traced and frozen (``get_backend("cpu", passes=False)``);
* ``compiled_torchscript``: traced, the static-shape passes, frozen (``cpu``, the default).

Prints JSON with decode ms per token for each, the ratios eager / compiled and unoptimized /
compiled (> 1 means the default compiled path is faster), how many nodes each pass changed, the
decode graph's node count with and without the passes, and whether all three produce the same
tokens. The sides run in alternation, best of ``--repeats``.

    python benchmarks/cpu_backend.py [--model gemma-4-e2b] [--variant tiny|mid] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from neuron_port import describe, load_config
from neuron_port.backends import get_backend
from neuron_port.backends.static_graph_passes import node_count
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model

SIDES = {"eager": ("cpu-eager", {}), "compiled_torchscript_unoptimized": ("cpu", {"passes": False}),
         "compiled_torchscript": ("cpu", {})}


def _decode_ms_per_token(port: Port, prompt, tokens: int) -> float:
    result = generate(port, GenerationRequest.greedy([prompt], tokens))
    return result.decode_s / max(1, result.decode_steps) * 1e3


def _config(model: str, variant: str):
    if variant == "tiny":
        return load_config(model, tiny=True)
    from decode_vs_hf import variant_config  # this folder's mid-size variant (run as a script)

    return variant_config("mid", model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-4-e2b")
    ap.add_argument("--variant", choices=["tiny", "mid"], default="tiny")
    ap.add_argument("--context", type=int, default=24, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = build_model(_config(args.model, args.variant), seed=0)
    layout = describe(model)
    prompt = [2] + [10 + i % (layout.vocab_size - 10) for i in range(args.context - 1)]
    bucket = -(-args.context // 32) * 32
    kv_len = -(-(bucket + args.tokens + 8) // 128) * 128
    ports, backends, compile_s, tokens = {}, {}, {}, {}
    for side, (name, options) in SIDES.items():
        port = Port.over_model(model, PortShape([bucket], [kv_len]), layout)
        backends[side] = get_backend(name, **options)
        t0 = time.perf_counter()
        port.compile(backends[side])
        compile_s[side] = time.perf_counter() - t0
        tokens[side] = generate(port, GenerationRequest.greedy([prompt], args.tokens)).tokens  # also the warm-up run
        ports[side] = port
    best = {side: float("inf") for side in SIDES}
    for _ in range(args.repeats):
        for side, port in ports.items():
            best[side] = min(best[side], _decode_ms_per_token(port, prompt, args.tokens))
    results = {side: {"decode_ms_per_token": round(best[side], 3), "compile_s": round(compile_s[side], 3)} for side in SIDES}
    nodes = {
        side: node_count(ports[side].runners.decode[kv_len].graph)
        for side in ("compiled_torchscript_unoptimized", "compiled_torchscript")
    }
    print(
        json.dumps(
            {
                "model": f"{args.model} ({args.variant})",
                "threads": torch.get_num_threads(),
                "context": args.context,
                **results,
                "ratio_eager_over_compiled": round(best["eager"] / best["compiled_torchscript"], 2),
                "ratio_unoptimized_over_compiled": round(
                    best["compiled_torchscript_unoptimized"] / best["compiled_torchscript"], 2
                ),
                "passes": backends["compiled_torchscript"].pass_counts,
                "decode_graph_nodes": {
                    "unoptimized": nodes["compiled_torchscript_unoptimized"],
                    "optimized": nodes["compiled_torchscript"],
                },
                "same_tokens": tokens["eager"] == tokens["compiled_torchscript"] == tokens["compiled_torchscript_unoptimized"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
