"""Gemma-4 12B over two NeuronCores (TP=2) — the port, top to bottom.

The 12B has no per-layer embeddings and no KV sharing (every layer owns KV), but it mixes two
attention types with different KV-head counts and head sizes: sliding layers have 16 q / 8 kv
heads of 256 (sharded 4 KV heads per rank), full layers 16 q / 1 kv head of 512 with K = V
(K = V: the full layers have no V projection). One KV head cannot be split over two ranks, so it is
replicated on both and every local query attends it. Its 1024-token window also overflowed
the compiler's fused attention, so attention stays eager (the library's default).

    python examples/gemma4_12b.py                   # tiny random weights, 2 gloo ranks on the CPU
    python examples/gemma4_12b.py --model-dir DIR   # real weights
    PJRT_DEVICE=CPU python examples/gemma4_12b.py --backend xla   # SPMD over 2 XLA CPU devices, checked in process
    python examples/gemma4_12b.py --model-dir DIR --backend nxd --dtype bf16   # inf2: ModelBuilder over 2 NeuronCores
"""

from __future__ import annotations

from neuron_port import describe, load_config
from neuron_port.artifacts.writer import write_artifact
from neuron_port.cli.recipe import artifact_dir, check_on_xla, load_checked, recipe_parser, run_recipe, validate_then_serve
from neuron_port.graph.shapes import PortShape
from neuron_port.parallel.ranks import RankSetup
from neuron_port.planner import Target, plan_capacity

NAME = "gemma-4-12b"


def main() -> int:
    args = recipe_parser(__doc__.splitlines()[0]).parse_args()

    # 1. Describe: two attention types with different KV heads and head sizes, every layer an owner.
    config = load_config(args.model_dir or NAME, tiny=args.model_dir is None)
    layout = describe(config)
    kinds = sorted({(s.attention, s.n_q, s.n_kv, s.head_dim, s.k_eq_v) for s in layout.layers})
    print(f"[describe] {layout.num_layers} layers, all {len(layout.kv_owners)} own KV; kinds {kinds}")

    # 2. Plan at the real dimensions.
    real = load_config(args.model_dir or NAME)
    capacity = plan_capacity(describe(real), real, NAME, Target.parse(args.target), tp=args.tp, quant=args.quant)
    tp = capacity.tp  # --tp, else the recommended degree: the plan shown is the plan used
    print(f"[plan] recommended tp {capacity.recommended_tp}, using tp {tp}; "
          f"{capacity.per_core_bytes['total'] / 2**30:.1f} GiB per core; "
          f"roofline {capacity.roofline_tok_per_s} tok/s, field report {capacity.measured_tok_per_s} tok/s (not this run)")

    # 3. Load, buffers checked.
    model, source = load_checked(NAME, args.model_dir, args.dtype, args.quant)

    # 4. Shard: one plan per attention type — sharded KV on sliding layers, replicated on full ones.
    setup = RankSetup.for_layout(layout, tp)
    for kind in ("sliding", "full"):
        layer = next(s for s in setup.plan.layers if s.attention == kind)
        ranks = [(list(r.kv_heads), r.groups) for r in layer.plan.ranks]
        print(f"[shard] {kind} layers ({layer.plan.strategy}): per rank (kv heads, groups) {ranks}")

    # 5. Graphs: each rank's store holds its share of the sliding KV heads and the replicated full one.
    shape = PortShape(buckets=32, kv_lens=256)
    per_rank = [stores.specs[256].total_bytes(1, 4) for stores in shape.rank_stores(setup)]
    print(f"[graphs] KV store per rank {per_rank} B")

    if args.backend == "xla":  # 6-8 on the XLA path: lowered and checked in this process, no artifact
        return check_on_xla(model, setup, shape, args)

    # 6. Compile: per-rank graphs, traced with the all-reduce inside, written atomically as one artifact.
    #    (nxd: one ModelBuilder traces every core's graphs from this process instead.)
    out = artifact_dir(args, "gemma4_12b_")
    manifest = write_artifact(out, model, source, setup, shape, backend=args.backend, tokenizer_dir=args.model_dir)
    print(f"[compile] tp {manifest.tp}: {len(manifest.files)} files in {out}")

    # 7-8. Reload in a fresh process and check against Hugging Face on CPU.
    return validate_then_serve(out, args)


if __name__ == "__main__":
    raise SystemExit(run_recipe(main))
