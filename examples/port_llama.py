"""Llama (and Qwen3) — the same port, a different family.

Nothing in the library is Gemma-shaped: a family adapter (``neuron_port.families``) names the
Hugging Face attributes, and every step below is the one the Gemma-4 recipes take. Llama-3.2-1B
is plain GQA: 32 query heads share 8 KV heads, every layer is full attention and owns its KV.
It fits one core, so the planner recommends tp 1; ``--tp 2`` or ``--tp 4`` shards it anyway.
The tiny variant keeps the 4:1 ratio with 8 q / 2 kv heads, so at TP=4 there are fewer KV heads
than ranks and each KV head is replicated on two ranks. ``--name qwen3`` runs the same story
on Qwen3 (q/k norms per head, 2 query heads per KV head).

    python examples/port_llama.py                       # tiny random weights, the planner's tp
    python examples/port_llama.py --tp 2                # 2 gloo ranks on the CPU
    python examples/port_llama.py --name qwen3 --tp 4   # Qwen3, KV heads fewer than ranks
    python examples/port_llama.py --model-dir DIR       # real weights
"""

from __future__ import annotations

from neuron_port import describe, load_config
from neuron_port.artifacts.writer import write_artifact
from neuron_port.cli.recipe import artifact_dir, check_on_xla, load_checked, recipe_parser, run_recipe, validate_then_serve
from neuron_port.graph.shapes import PortShape
from neuron_port.parallel.ranks import RankSetup
from neuron_port.planner import Target, plan_capacity


def main() -> int:
    parser = recipe_parser(__doc__.splitlines()[0])
    parser.add_argument("--name", default="llama", choices=["llama", "qwen3"], help="which shipped family config")
    args = parser.parse_args()

    # 1. Describe: every layer full attention and a KV owner; one head shape throughout.
    config = load_config(args.model_dir or args.name, tiny=args.model_dir is None)
    layout = describe(config)
    print(f"[describe] {layout.model_type}: {layout.num_layers} layers, {len(layout.kv_owners)} KV owners, "
          f"heads {sorted({(s.n_q, s.n_kv) for s in layout.layers})}")

    # 2. Plan at the real dimensions.
    real = load_config(args.model_dir or args.name)
    capacity = plan_capacity(describe(real), real, args.name, Target.parse(args.target), tp=args.tp, quant=args.quant)
    tp = capacity.tp  # --tp, else the recommended degree: the plan shown is the plan used
    print(f"[plan] recommended tp {capacity.recommended_tp}, using tp {tp}; "
          f"{capacity.per_core_bytes['total'] / 2**30:.2f} GiB per core")

    # 3. Load, buffers checked (Llama and Qwen3 declare no per-layer buffers; the audit still runs).
    model, source = load_checked(args.name, args.model_dir, args.dtype, args.quant)

    # 4. Shard: the same rule as Gemma-4's. At tp 2 the KV heads split; at tp 4 (tiny) they replicate.
    setup = RankSetup.for_layout(layout, tp)
    heads = setup.plan.layers[0].plan
    print(f"[shard] tp {tp}: {heads.strategy}; " + "; ".join(
        f"rank {r.rank} q {list(r.q_heads)} -> kv {list(r.kv_heads)}" for r in heads.ranks))

    # 5. Graphs: each rank's prefill (bucket 32) and decode graphs over its own KV store.
    shape = PortShape(buckets=32, kv_lens=256)
    per_rank = [stores.specs[256].total_bytes(1, 4) for stores in shape.rank_stores(setup)]
    print(f"[graphs] KV store per rank {per_rank} B")

    if args.backend == "xla":  # 6-8 on the XLA path: lowered and checked in this process, no artifact
        return check_on_xla(model, setup, shape, args)

    # 6. Compile: each rank takes its shard, builds those graphs, traces them (with the all-reduce
    #    inside when tp > 1), and the artifact is written atomically.
    out = artifact_dir(args, f"port_{args.name}_")
    manifest = write_artifact(out, model, source, setup, shape, backend=args.backend, tokenizer_dir=args.model_dir)
    print(f"[compile] tp {manifest.tp}: {len(manifest.files)} files in {out}")

    # 7-8. Reload in a fresh process and check against Hugging Face on CPU, then serve with --serve.
    return validate_then_serve(out, args)


if __name__ == "__main__":
    raise SystemExit(run_recipe(main))
