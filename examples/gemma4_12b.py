"""Gemma-4 12B over two NeuronCores (TP=2) — the port, top to bottom.

The 12B has no per-layer embeddings and no KV sharing (every layer owns KV), but it mixes two
attention types with different KV-head counts and head sizes: sliding layers have 16 q / 8 kv
heads of 256 (sharded 4 KV heads per rank), full layers 16 q / 1 kv head of 512 with K = V
(``attention_k_eq_v``: no v_proj). One KV head cannot be split over two ranks, so it is
replicated on both and every local query attends it. Its 1024-token window also overflowed
the compiler's fused attention, so attention stays eager (the library's default).

    python examples/gemma4_12b.py                   # tiny random weights, 2 gloo ranks on the CPU
    python examples/gemma4_12b.py --model-dir DIR   # real weights
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from neuron_port import describe, load_config
from neuron_port.buffers import audit_buffers
from neuron_port.compiled import check_in_fresh_process, compile_artifact
from neuron_port.models import build_model, load_model_dir, read_checkpoint
from neuron_port.planner import Target, plan_capacity
from neuron_port.sharding import plan_model

NAME = "gemma-4-12b"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", help="a local model directory with real weights (default: tiny random weights)")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "neuron"])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--target", default="inf2.xlarge")
    ap.add_argument("--out", help="artifact directory (default: a temporary one)")
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--serve", action="store_true", help="serve the artifact over HTTP afterwards")
    args = ap.parse_args()

    # 1. Describe: two attention types with different KV heads and head sizes, every layer an owner.
    config = load_config(args.model_dir or NAME, tiny=args.model_dir is None)
    layout = describe(config)
    kinds = sorted({(s.attention, s.n_q, s.n_kv, s.head_dim, s.k_eq_v) for s in layout.layers})
    print(f"[describe] {layout.num_layers} layers, all {len(layout.kv_owners)} own KV; kinds {kinds}")

    # 2. Plan at the real dimensions.
    real = load_config(args.model_dir or NAME)
    plan = plan_capacity(describe(real), real, NAME, Target.parse(args.target))
    print(f"[plan] recommended tp {plan.recommended_tp}; {plan.per_core_bytes['total'] / 2**30:.1f} GiB per core at "
          f"tp {plan.tp}; roofline {plan.roofline_tok_per_s} tok/s, measured {plan.measured_tok_per_s} tok/s")

    # 3. Load, buffers checked.
    if args.model_dir:
        model = load_model_dir(args.model_dir)
        print(f"[load] buffers differing: {[str(p) for p in audit_buffers(model, read_checkpoint(args.model_dir))] or 'none'}")
        source = {"kind": "dir", "path": str(Path(args.model_dir).resolve())}
    else:
        model = build_model(config, seed=0)
        source = {"kind": "shipped", "name": NAME, "tiny": True, "seed": 0}

    # 4. Shard: one plan per attention type — sharded KV on sliding layers, replicated on full ones.
    shard_plan = plan_model(layout, args.tp)
    for kind in ("sliding", "full"):
        layer = next(s for s in shard_plan.layers if s.attention == kind)
        ranks = [(list(r.kv_heads), r.groups) for r in layer.plan.ranks]
        print(f"[shard] {kind} layers ({layer.plan.strategy}): per rank (kv heads, groups) {ranks}")

    # 5-6. Per-rank graphs, traced with the all-reduce inside, written atomically as one artifact.
    out = Path(args.out or tempfile.mkdtemp(prefix="gemma4_12b_")) / "artifact"
    manifest = compile_artifact(model, out, source, buckets=(32,), kv_lens=(256,), tp=args.tp, backend=args.backend,
                                tokenizer_dir=args.model_dir)
    print(f"[compile] tp {manifest['tp']}: {len(manifest['files'])} files in {out}")

    # 7. Reload in a fresh process and check against HF on CPU.
    result = check_in_fresh_process(out, args.prompt_len, args.max_new_tokens)
    print(f"[validate] {result['new_tokens']} tokens, decode {result['decode_tok_per_s']} tok/s")
    print(f"SEQ_MATCH {result['seq_match']}")

    if args.serve:
        from neuron_port.serve import build_app, load_served, serve

        serve(build_app(lambda: load_served(str(out))))
    return 0 if result["seq_match"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
