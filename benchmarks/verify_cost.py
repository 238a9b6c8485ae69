"""What a verify step of speculative decoding moves on a device, read from its optimized HLO, against a decode step.

A verify step of ``k`` drafts runs the target over ``k + 1`` tokens (the pending one, then the drafts) against the
store: the weights are read once, as in a decode step, the K/V too; what grows with ``k`` is the activations, the
``k + 1`` rows of logits and the ``k + 1`` K/V rows written. Each verify step makes ``1 + a + ... + a^k`` tokens
on average at a per-draft acceptance ``a`` (``planner.expected_tokens_per_step``), so its tok/s on inf2 is the
bandwidth over its bytes times that.

Per model and context, in one process per model (XLA's device count is fixed per process), one port lowered through
torch-xla at the model's degree (SPMD over tp CPU devices; the module read is one device's) with verify graphs for
the largest ``k``: its decode graph at KV length = context and its verify graphs of ``k + 1`` tokens for each ``k``,
each called once on the one device-resident store, their traffic read by
:func:`neuron_port.backends.hlo_cost.traffic`. Both are the same port's graphs over the same store (its rings hold
``window + k`` slots, as speculation needs), so their difference is the verify step's own.

Scaled as ``decode_cost.py`` scales (every width and the context divided by ``--scale``; bytes given at real size,
x scale^2, in bf16): what shrinks by ``scale`` only (activations, logits rows, masks) weighs ``scale`` times more
than at real size, and a verify step has ``k + 1`` times decode's of them, so the verify/decode ratio here is an upper
bound. The modelled tok/s use the planner's HBM bandwidth per inf2 core (compute left out: ceilings).

    PJRT_DEVICE=CPU python benchmarks/verify_cost.py --json
    PJRT_DEVICE=CPU python benchmarks/verify_cost.py --smoke --json     # E2B at 4096, scale 32, k = 2 (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_cost import DTYPE_BYTES, REPORTED_BYTES, _model  # noqa: E402 - the sibling benchmark's scaled models

MODELS = {"gemma-4-e2b": 1, "gemma-4-12b": 2}
DRAFTS = (2, 4, 8)
# prompt lookup's acceptance (accepted / drafted) measured on the real Gemma-3 270M by benchmarks/speculative_lookup.py
# (stop 64), modelled here as a per-draft acceptance beside the 0.5 and 0.7
ACCEPTANCES = (0.5, 0.7, 0.64)
PROMPT = 8


def port_rows(name: str, tp: int, contexts: list[int], scale: int, drafts: list[int]) -> list[dict]:
    """The decode graph's and each verify graph's traffic and decode's minimum, per scaled context, on ``tp`` XLA
    devices of this process."""
    from neuron_port import describe
    from neuron_port.backends.xla_port import xla_port
    from neuron_port.graph.shapes import PortShape
    from neuron_port.graph.step import run_step
    from neuron_port.parallel.ranks import RankSetup

    model = _model(name, scale)
    setup = RankSetup.for_layout(describe(model), tp)
    rows = []
    for context in contexts:
        kv = context // scale
        port, backend = xla_port(model, setup, PortShape(PROMPT, kv, draft_tokens=max(drafts)), decode_rows=())
        with torch.no_grad():  # as the scheduler runs xla graphs (autograd's bookkeeping would lower as copies)
            inputs, store = port.example_inputs("decode", kv)  # a zeroed store: the first call lays it on the device
            _, store = run_step(port.runners.decode[kv], inputs, store)
            for k in drafts:
                _, store = run_step(port.runners.verify[k + 1], port.example_inputs("verify", k + 1)[0], store)
        seen = backend.recorder.graphs
        missing = [f"verify_{k + 1}" for k in drafts if seen.get(f"verify_{k + 1}", {}).get("traffic") is None]
        if missing:
            raise RuntimeError(f"{name} at {context}: no HLO seen for {missing}")
        row_bytes = port.stores.largest.row_bytes(1, DTYPE_BYTES)  # one position's K/V rows, every owner
        rows.append({"context": context, "kv_len": kv, "decode": backend.decode_cost(), "row_bytes": row_bytes,
                     "verify": {str(k): seen[f"verify_{k + 1}"]["traffic"] for k in drafts}})
    return rows


def _spawn(model: str, tp: int, contexts: list[int], scale: int, drafts: list[int]) -> list[dict]:
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--tp", str(tp), "--contexts",
           ",".join(map(str, contexts)), "--scale", str(scale), "--drafts", ",".join(map(str, drafts))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PJRT_DEVICE": "CPU"})
    if proc.returncode:
        raise RuntimeError(f"the worker for {model} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _model_rows(model: str, tp: int, worker_rows: list[dict], scale: int, acceptances: list[float],
                bandwidth: float) -> list[dict]:
    from neuron_port.planner import expected_tokens_per_step

    real = scale * scale * REPORTED_BYTES // DTYPE_BYTES  # every leading term scales by scale^2 (decode_cost.py)
    out = []
    for row in worker_rows:
        decode = row["decode"]
        decode_bytes = decode["bytes"] * real
        decode_rate = bandwidth / decode_bytes
        for k, moved in row["verify"].items():
            k = int(k)
            verify_bytes = moved["total"] * real
            minimum = (decode["minimum_bytes"] + k * row["row_bytes"]) * real
            rates = {f"{a:g}": round(bandwidth / verify_bytes * expected_tokens_per_step(a, k), 1) for a in acceptances}
            out.append({
                "model": model, "tp": tp, "context": row["context"], "draft_tokens": k,
                "decode_bytes": decode_bytes, "verify_bytes": verify_bytes, "verify_minimum_bytes": minimum,
                "verify_over_decode": round(verify_bytes / decode_bytes, 4),
                "verify_ratio_to_minimum": round(verify_bytes / minimum, 4),
                "verify_by_class": {name: v * real for name, v in moved.items() if name != "total"},
                "decode_tok_per_s": round(decode_rate, 1), "verify_tok_per_s": rates,
                "speedup": {a: round(rate / decode_rate, 2) for a, rate in rates.items()},
            })
    return out


def run(models: dict[str, int], contexts: list[int], scale: int, drafts: list[int], acceptances: list[float]) -> dict:
    from neuron_port.planner import TARGETS

    bandwidth = TARGETS["inf2.xlarge"].hbm_bw_per_core
    results = []
    for model, tp in models.items():
        results += _model_rows(model, tp, _spawn(model, tp, contexts, scale, drafts), scale, acceptances, bandwidth)
    return {"benchmark": "verify_cost", "scale": scale, "lowered_dtype": "fp32", "reported_dtype": "bf16",
            "target": "inf2.xlarge", "hbm_bytes_per_s_per_core": bandwidth, "acceptances": acceptances,
            "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated shipped names")
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--scale", type=int, default=8, help="divide every width and the context by this (1: real size)")
    ap.add_argument("--drafts", default=",".join(map(str, DRAFTS)), help="drafted tokens per verify step, k")
    ap.add_argument("--acceptance", default=",".join(map(str, ACCEPTANCES)),
                    help="per-draft acceptance rates to model (default 0.5, 0.7 and prompt lookup's measured 0.64)")
    ap.add_argument("--smoke", action="store_true", help="E2B at context 4096, scale 32, k = 2")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    contexts, drafts = [int(c) for c in args.contexts.split(",")], [int(k) for k in args.drafts.split(",")]
    if args.worker:
        print(json.dumps(port_rows(args.model, args.tp, contexts, args.scale, drafts)))
        return
    if args.smoke:
        args.models, contexts, args.scale, drafts = "gemma-4-e2b", [4096], 32, [2]
    models = {m: MODELS.get(m, 1) for m in args.models.split(",")}
    out = run(models, contexts, args.scale, drafts, [float(a) for a in args.acceptance.split(",")])
    print(json.dumps(out, indent=2 if args.json else None))


if __name__ == "__main__":
    main()
