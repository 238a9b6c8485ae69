"""Compiled (TorchScript-traced) CPU graphs against eager ones: decode time per token.

Same static graphs, same inputs, same store; only the backend differs. Prints JSON with the
ratio eager / compiled (> 1 means the compiled path is faster).

    python benchmarks/cpu_backend.py [--model gemma-4-e2b] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from neuron_port import describe, load_config
from neuron_port.backends import get_backend
from neuron_port.models import build_model
from neuron_port.port import Port, greedy_generate


def _decode_ms_per_token(port: Port, prompt, tokens: int, repeats: int) -> float:
    greedy_generate(port, [prompt], 8)  # warm up (TorchScript's profiling executor optimises early runs)
    best = float("inf")
    for _ in range(repeats):
        result = greedy_generate(port, [prompt], tokens)
        best = min(best, result.decode_s / max(1, result.decode_steps) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma-4-e2b")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = build_model(load_config(args.model, tiny=True), seed=0)
    layout = describe(model)
    prompt = [2] + list(range(10, 33))
    results = {}
    outputs = {}
    for name in ("cpu-eager", "cpu"):
        port = Port(copy.deepcopy(model), layout, [32], [256])
        t0 = time.perf_counter()
        port.compile(get_backend(name))
        compile_s = time.perf_counter() - t0
        outputs[name] = greedy_generate(port, [prompt], args.tokens).tokens
        results[name] = {"decode_ms_per_token": round(_decode_ms_per_token(port, prompt, args.tokens, args.repeats), 3),
                         "compile_s": round(compile_s, 3)}
    print(json.dumps({
        "model": f"{args.model} (tiny)",
        "threads": torch.get_num_threads(),
        "eager": results["cpu-eager"],
        "compiled_torchscript": results["cpu"],
        "ratio_eager_over_compiled": round(results["cpu-eager"]["decode_ms_per_token"] / results["cpu"]["decode_ms_per_token"], 2),
        "same_tokens": outputs["cpu"] == outputs["cpu-eager"],
    }, indent=2))


if __name__ == "__main__":
    main()
