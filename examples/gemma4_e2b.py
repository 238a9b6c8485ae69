"""Gemma-4 E2B on one NeuronCore — the port, top to bottom.

E2B is the friendly one: in bf16 it fits a single 16 GiB core (4.63 B real parameters, 2.75 B of
them embeddings that stay on the host). What breaks the vendor stack is cross-layer KV sharing:
only layers 0-14 compute K/V; the other 20 read layer 13's (sliding) or 14's (full). The port
traces Hugging Face's own forward into a prefill and a decode graph over a KV store that only
those 15 owners allocate, sliding owners as rings of the 512-token window.

    python examples/gemma4_e2b.py                          # tiny random weights, CPU backend
    python examples/gemma4_e2b.py --model-dir DIR          # real weights (config.json, safetensors, tokenizer)
    python examples/gemma4_e2b.py --model-dir DIR --backend neuron --dtype bf16   # inf2: ModelBuilder on one NeuronCore
    PJRT_DEVICE=CPU python examples/gemma4_e2b.py --backend xla   # through torch-xla, checked in process
"""

from __future__ import annotations

from neuron_port import describe, load_config
from neuron_port.artifacts.writer import write_artifact
from neuron_port.cli.recipe import artifact_dir, check_on_xla, load_checked, recipe_parser, run_recipe, validate_then_serve
from neuron_port.graph.kv import naive_kv_bytes
from neuron_port.graph.shapes import PortShape
from neuron_port.parallel.ranks import RankSetup
from neuron_port.planner import Target, plan_capacity

NAME = "gemma-4-e2b"


def main() -> int:
    args = recipe_parser(__doc__.splitlines()[0]).parse_args()

    # 1. Describe: which layers own KV, which read another layer's, what each attends with.
    config = load_config(args.model_dir or NAME, tiny=args.model_dir is None)
    layout = describe(config)
    shared = [s for s in layout.layers if not s.is_owner]
    print(f"[describe] {layout.num_layers} layers, KV owners {list(layout.kv_owners)}; "
          f"{len(shared)} shared layers read layers {sorted({s.kv_source for s in shared})}")

    # 2. Plan at the real dimensions: one core in bf16, and the roofline next to the field report's rate.
    real = load_config(args.model_dir or NAME)
    capacity = plan_capacity(describe(real), real, NAME, Target.parse(args.target), tp=args.tp, quant=args.quant)
    tp = capacity.tp  # --tp, else the recommended degree: the plan shown is the plan used
    print(f"[plan] recommended tp {capacity.recommended_tp}, using tp {tp}; "
          f"{capacity.per_core_bytes['total'] / 2**30:.1f} GiB per core; "
          f"roofline {capacity.roofline_tok_per_s} tok/s, field report {capacity.measured_tok_per_s} tok/s (not this run)")

    # 3. Load the weights and make sure no buffer was lost (Gemma-4's per-layer scalar is a buffer, not a parameter).
    model, source = load_checked(NAME, args.model_dir, args.dtype, args.quant)

    # 4. Shard: at tp 1 every rank plan is the whole model; the setup is still what every later step uses.
    setup = RankSetup.for_layout(layout, tp)
    print(f"[shard] tp {setup.tp}: KV heads per owner layer {sorted(set(setup.plan.local_kv_heads(0).values()))}")

    # 5. Graphs: a prefill graph for the 32-token bucket and a decode graph over a 256-slot store.
    shape = PortShape(buckets=32, kv_lens=256)
    store = shape.rank_stores(setup)[0].specs[256]
    print(f"[graphs] KV store {store.total_bytes(1, 4):,} B (owners only, rings of {layout.sliding_window}) "
          f"vs {naive_kv_bytes(layout, 256, 1, 4):,} B if every layer kept a full-length cache")

    if args.backend == "xla":  # 6-8 on the XLA path: lowered and checked in this process, no artifact
        return check_on_xla(model, setup, shape, args)

    # 6. Compile: the rank builds those graphs over its model, the backend compiles them, and the
    #    verified artifact is written atomically.
    out = artifact_dir(args, "gemma4_e2b_")
    manifest = write_artifact(out, model, source, setup, shape, backend=args.backend, tokenizer_dir=args.model_dir)
    print(f"[compile] {len(manifest.files)} files in {out}, weights fingerprint {manifest.weights_fingerprint[:16]}…")

    # 7-8. Reload it the way a server will (a fresh process, the directory alone), check it against
    #      Hugging Face on CPU, then serve it with --serve (OpenAI-compatible API).
    return validate_then_serve(out, args)


if __name__ == "__main__":
    raise SystemExit(run_recipe(main))
