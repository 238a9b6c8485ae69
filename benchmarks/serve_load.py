"""The server under load: continuous against static batching, in one run, at 1, 4, 16 and 64 clients.

Two servers in turn (``neuron-port serve gemma-4-e2b --tiny --max-batch 4``, ``--batching
continuous`` then ``--batching static``), each driven by the same seeded mix of streamed
completion requests (prompts of 4 to 24 tokens; 8, 16, 64 or 128 new tokens, greedy, EOS
ignored). Each server first answers a warm-up round (one request of every length, not counted:
TorchScript optimizes a graph over its first runs, which would otherwise land on the first level).
At each concurrency level every client sends its requests one after another. Per
level: aggregate generated tokens per second (over the wall time of the level), and p50 / p99 of
the time to first token and of the latency; ratios static / continuous for the first-token time.

    python benchmarks/serve_load.py --json
    python benchmarks/serve_load.py --smoke --json      # 1 and 4 clients, short requests (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import ServerProcess  # noqa: E402

MODEL = "gemma-4-e2b"
LENGTHS = (8, 16, 64, 128)


def requests_for(clients: int, per_client: int, seed: int, smoke: bool) -> list[list[dict]]:
    rng = random.Random(seed * 1000 + clients)
    lengths = (4, 8) if smoke else LENGTHS
    return [[{"model": MODEL, "prompt": [2] + [rng.randrange(6, 500) for _ in range(rng.randrange(3, 24))],
              "max_tokens": rng.choice(lengths), "temperature": 0, "ignore_eos": True, "stream": True}
             for _ in range(per_client)] for _ in range(clients)]


async def one(client: httpx.AsyncClient, base: str, body: dict) -> tuple[float, float, int]:
    """(time to first token, latency, tokens) of one streamed request."""
    t0, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", base + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                tokens += 1
                first = first if first is not None else time.perf_counter() - t0
    return first, time.perf_counter() - t0, tokens


async def level(base: str, plan: list[list[dict]]) -> dict:
    async def client_run(client, bodies):
        return [await one(client, base, body) for body in bodies]

    limits = httpx.Limits(max_connections=len(plan) + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(client_run(client, b) for b in plan)) for r in rs]
        wall = time.perf_counter() - t0
    ttft, latency = sorted(r[0] for r in results), sorted(r[1] for r in results)

    def pct(values, q):
        return round(values[min(len(values) - 1, int(q * len(values)))], 3)

    return {"requests": len(results), "tokens_per_s": round(sum(r[2] for r in results) / wall, 1),
            "ttft_p50_s": round(statistics.median(ttft), 3), "ttft_p99_s": pct(ttft, 0.99),
            "latency_p50_s": round(statistics.median(latency), 3), "latency_p99_s": pct(latency, 0.99)}


def run_mode(batching: str, levels: list[int], smoke: bool) -> dict:
    srv = ServerProcess(MODEL, "--tiny", "--max-batch", "4", "--max-queue", "256", "--batching", batching)
    try:
        out = {}
        warm = [[{**body, "max_tokens": n} for n in ((4, 8) if smoke else LENGTHS)]
                for body in requests_for(1, 1, 99, smoke)[0]]
        asyncio.run(level(srv.base, warm))
        for clients in levels:
            per_client = 1 if clients >= 64 else (2 if clients >= 16 else (4 if clients >= 4 else 8))
            out[str(clients)] = asyncio.run(level(srv.base, requests_for(clients, per_client, 0, smoke)))
        return out
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    levels = [1, 4] if args.smoke else [1, 4, 16, 64]
    results = {mode: run_mode(mode, levels, args.smoke) for mode in ("continuous", "static")}
    cont, stat = results["continuous"], results["static"]
    ratios = {c: {"ttft_p50_static_over_continuous": round(stat[c]["ttft_p50_s"] / max(1e-9, cont[c]["ttft_p50_s"]), 2),
                  "ttft_p99_static_over_continuous": round(stat[c]["ttft_p99_s"] / max(1e-9, cont[c]["ttft_p99_s"]), 2),
                  "tokens_per_s_continuous_over_static": round(cont[c]["tokens_per_s"] / max(1e-9, stat[c]["tokens_per_s"]), 2)}
              for c in cont}
    out = {"benchmark": "serve_load", "model": f"{MODEL} tiny", "slots": 4, "results": results, "ratios": ratios,
           "cpus": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()}
    print(json.dumps(out, indent=2 if args.json else None))


if __name__ == "__main__":
    main()
