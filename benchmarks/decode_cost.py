"""What one decode step moves on a device, read from its optimized HLO, against the least it must.

On Inferentia2 a decode step is bound by HBM traffic. The optimized HLO torch-xla produces on the
CPU PJRT device is read by :func:`neuron_port.backends.hlo_cost.traffic` (bytes each instruction of
the entry computation reads and writes; fusions as one), and set against the minimum
(:func:`neuron_port.backends.hlo_cost.minimum_decode_bytes`: the core's device weights read once,
the K/V attention reads at that context, the new rows written). Per model and context, in one run:

* the port's decode graph at KV length = context, at the model's degree (SPMD over tp XLA CPU
  devices, so the module read is one device's);
* Hugging Face's own decode step with its ``StaticCache`` (one ``forward`` at the last position,
  the cache updated in place so XLA aliases it), lowered the same way on one device; its ratio is
  against the same minimum at tp 1 (it is not sharded).

Scaled models. The real E4B and 12B do not fit this host in bf16 twice (host and XLA device), so
each model is lowered with every width divided by ``--scale`` (hidden, intermediate, head sizes,
vocabulary, per-layer input width, sliding window) and the context divided by the same factor;
layer counts, head counts, KV sharing and attention types stay. The weights then shrink by
scale^2, and the K/V at the scaled context by scale x scale, so the leading terms keep their
shares; what shrinks by ``scale`` only (activations, attention scores, masks, per-layer vectors)
weighs ``scale`` times more than at real size, so a scaled model overstates the ratio. Measured on
E2B, the ratio falls linearly as the scale goes down (benchmarks/README.md): read the figures as
upper bounds. ``bytes`` and ``minimum_bytes`` are given at real size (x scale^2), with the
roofline tok/s each implies on one inf2 core (the planner's HBM bandwidth per core).

    PJRT_DEVICE=CPU python benchmarks/decode_cost.py --json
    PJRT_DEVICE=CPU python benchmarks/decode_cost.py --smoke --json     # E2B at 4096, scale 32 (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import torch

MODELS = {"gemma-4-e2b": 1, "gemma-4-e4b": 2, "gemma-4-12b": 2}
CONTEXTS = (512, 4096, 32768)
SCALED_WIDTHS = ("hidden_size", "intermediate_size", "head_dim", "global_head_dim", "vocab_size",
                 "vocab_size_per_layer_input", "hidden_size_per_layer_input", "sliding_window")
PROMPT = 4
DTYPE = torch.float32  # XLA's CPU backend has no bf16 matmul: it would add f32 converts a NeuronCore does not make
DTYPE_BYTES = 4
REPORTED_BYTES = 2  # figures are given for bf16, the dtype a device runs: every term halves, the ratio stays


def scaled_config(name: str, scale: int) -> Any:
    """``name``'s text config with every width (and the window) divided by ``scale``."""
    from neuron_port.families import family_for
    from neuron_port.model.configs import load_config_dict

    text = load_config_dict(name)
    for key in SCALED_WIDTHS:
        if text.get(key):
            if text[key] % scale:
                raise ValueError(f"{name}: {key} {text[key]} is not divisible by the scale {scale}")
            text[key] //= scale
    return family_for(text["model_type"]).make_config(text)


def _model(name: str, scale: int) -> torch.nn.Module:
    from neuron_port.model.loading import build_model

    return build_model(scaled_config(name, scale), seed=0, dtype=DTYPE)


def port_rows(name: str, tp: int, contexts: list[int], scale: int, kv_write: str) -> list[dict]:
    """The port's decode graph at each scaled context, on ``tp`` XLA devices (this process's), its KV
    written by ``kv_write``: ``rows`` (the new rows only, the XLA backend's default) or ``blend`` (a
    select over the whole store, what every decode graph did before)."""
    from neuron_port import describe
    from neuron_port.backends.xla_port import xla_port
    from neuron_port.generation.generate import generate
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.graph.kv import KVWrite
    from neuron_port.graph.shapes import PortShape
    from neuron_port.parallel.ranks import RankSetup

    model = _model(name, scale)
    setup = RankSetup.for_layout(describe(model), tp)
    rows = []
    for context in contexts:
        port, backend = xla_port(model, setup, PortShape(8, context // scale), kv_write=KVWrite(kv_write))
        generate(port, GenerationRequest.greedy([[2] + [7] * (PROMPT - 1)], 2))  # prefill, then one decode step
        cost = backend.report()["decode_cost"]
        rows.append({**cost, "context": context, "kv_len": cost["context"]})
    return rows


def hf_rows(name: str, contexts: list[int], scale: int) -> list[dict]:
    """Hugging Face's decode step with its static cache at each scaled context, on one XLA device."""
    import torch_xla
    from transformers import StaticCache

    from neuron_port import describe
    from neuron_port.backends.hlo_cost import decode_cost
    from neuron_port.backends.xla import XlaBackend
    from neuron_port.graph.kv import kv_store_spec
    from neuron_port.parallel.per_core import device_params_per_core

    model = _model(name, scale)
    layout = describe(model)
    backend = XlaBackend()  # its recorder reads what XLA compiles in this process
    device = torch_xla.device()
    model.to(device)
    weights = device_params_per_core(layout, model.config, 1) * DTYPE_BYTES
    rows = []
    for context in contexts:
        kv_len = context // scale
        cache = StaticCache(config=model.config, max_cache_len=kv_len)
        position = torch.tensor([kv_len - 1], device=device)

        def step(cache=cache, position=position) -> torch.Tensor:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([[7]], device=device), position_ids=position[None],
                               cache_position=position, past_key_values=cache, use_cache=True).logits
            torch_xla.sync()  # the logits are live: the step computes them (a dead output would be pruned)
            return logits.cpu()

        name_of = f"hf_decode_{kv_len}"
        backend.recorder.watch(f"hf_first_{kv_len}", step)  # the first call also lays the cache out on the device
        backend.recorder.watch(name_of, step)  # the steady step: the cache in place, aliased
        moved = backend.recorder.graphs[name_of]["traffic"]
        if moved is None:
            raise RuntimeError(f"Hugging Face's decode step at {kv_len} compiled nothing new: its HLO was not seen")
        cost = decode_cost(moved, weights, kv_store_spec(layout, kv_len), kv_len, 1, DTYPE_BYTES, layout.kv_readers())
        rows.append({**cost, "context": context, "kv_len": kv_len})
    return rows


def _worker(args: argparse.Namespace) -> None:
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = (hf_rows(args.model, contexts, args.scale) if args.worker == "hf"
            else port_rows(args.model, args.tp, contexts, args.scale, args.worker.removeprefix("port_")))
    print(json.dumps(rows))


def _spawn(side: str, model: str, tp: int, contexts: list[int], scale: int) -> list[dict]:
    """One side of one model in its own process (XLA's device count is fixed per process)."""
    cmd = [sys.executable, __file__, "--worker", side, "--model", model, "--tp", str(tp),
           "--contexts", ",".join(map(str, contexts)), "--scale", str(scale)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PJRT_DEVICE": "CPU"})
    if proc.returncode:
        raise RuntimeError(f"{side} worker for {model} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(models: dict[str, int], contexts: list[int], scale: int) -> dict:
    from neuron_port.planner import TARGETS

    bandwidth = TARGETS["inf2.xlarge"].hbm_bw_per_core
    real = scale * scale * REPORTED_BYTES // DTYPE_BYTES  # every leading term scales by scale^2 (module doc)
    results = []
    for model, tp in models.items():
        sides = {side: _spawn(side, model, 1 if side == "hf" else tp, contexts, scale)
                 for side in ("port_rows", "port_blend", "hf")}
        for ours, blend, theirs in zip(sides["port_rows"], sides["port_blend"], sides["hf"], strict=True):
            results.append({
                "model": model, "tp": tp, "context": ours["context"],
                "bytes": ours["bytes"] * real, "minimum_bytes": ours["minimum_bytes"] * real, "ratio": ours["ratio"],
                "hf_ratio": theirs["ratio"], "blend_ratio": blend["ratio"],
                "by_class": {k: v * real for k, v in ours["by_class"].items()},
                "blend_by_class": {k: v * real for k, v in blend["by_class"].items()},
                "hf_bytes_tp1": theirs["bytes"] * real,
                "roofline_tok_per_s": round(bandwidth / (ours["bytes"] * real), 1),
                "blend_roofline_tok_per_s": round(bandwidth / (blend["bytes"] * real), 1),
                "minimum_roofline_tok_per_s": round(bandwidth / (ours["minimum_bytes"] * real), 1),
            })
    return {"benchmark": "decode_cost", "scale": scale, "lowered_dtype": "fp32", "reported_dtype": "bf16",
            "target": "inf2.xlarge", "hbm_bytes_per_s_per_core": bandwidth, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated shipped names")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--scale", type=int, default=8, help="divide every width and the context by this (1: real size)")
    ap.add_argument("--smoke", action="store_true", help="E2B at context 4096, scale 32")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", choices=["port_rows", "port_blend", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args)
    if args.smoke:
        args.models, args.contexts, args.scale = "gemma-4-e2b", "4096", 32
    models = {m: MODELS[m] for m in args.models.split(",")}
    out = run(models, [int(c) for c in args.contexts.split(",")], args.scale)
    print(json.dumps(out, indent=2 if args.json else None))


if __name__ == "__main__":
    main()
