"""KV store bytes against context for the three real Gemma-4 configs, three designs side by side.

* owners + rings: the library's store: only KV-owning layers, sliding owners as rings of the
  window (what the graphs carry);
* owners, full length: only owners, every buffer the full context (the field report's store);
* every layer, full length: what a port that ignores KV sharing and windows allocates.

bf16, batch 1, tp 1. Prints a table (or JSON with ``--json``) and writes a PNG with ``--plot``.

    python benchmarks/kv_memory.py --json --plot benchmarks/kv_memory.png
    python benchmarks/kv_memory.py --smoke --json
"""

from __future__ import annotations

import argparse
import json

from neuron_port import describe, load_config
from neuron_port.graph.kv import kv_store_spec, naive_kv_bytes

MODELS = ("gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b")
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
DESIGNS = ("owners_rings", "owners_full", "every_layer_full")


def kv_bytes(name: str, contexts, dtype_bytes: int = 2, tiny: bool = False) -> list[dict]:
    layout = describe(load_config(name, tiny=tiny))
    rows = []
    for ctx in contexts:
        rows.append({
            "context": ctx,
            "owners_rings": kv_store_spec(layout, ctx).total_bytes(1, dtype_bytes),
            "owners_full": kv_store_spec(layout, ctx, ring_buffers=False).total_bytes(1, dtype_bytes),
            "every_layer_full": naive_kv_bytes(layout, ctx, 1, dtype_bytes),
        })
    return rows


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), sharey=True)
    for ax, (name, rows) in zip(axes if len(results) > 1 else [axes], results.items(), strict=True):
        ctx = [r["context"] for r in rows]
        for design, style in zip(DESIGNS, ("-o", "--s", ":^"), strict=True):
            ax.loglog(ctx, [r[design] / 2**20 for r in rows], style, label=design.replace("_", " "), base=2)
        ax.set_title(name)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    (axes[0] if len(results) > 1 else axes).set_ylabel("KV store (MiB, bf16, batch 1)")
    (axes[0] if len(results) > 1 else axes).legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", help="write a PNG here (needs matplotlib: the 'plot' extra)")
    ap.add_argument("--smoke", action="store_true", help="tiny configs, three contexts (a CI smoke run)")
    args = ap.parse_args()
    contexts = (64, 256, 1024) if args.smoke else CONTEXTS
    results = {name: kv_bytes(name, contexts, tiny=args.smoke) for name in MODELS}
    summary = {
        name: {"context": rows[-1]["context"],
               "owners_full_over_owners_rings": round(rows[-1]["owners_full"] / rows[-1]["owners_rings"], 2),
               "every_layer_full_over_owners_rings": round(rows[-1]["every_layer_full"] / rows[-1]["owners_rings"], 2)}
        for name, rows in results.items()
    }
    if args.plot:
        plot(results, args.plot)
    if args.json:
        print(json.dumps({"benchmark": "kv_memory", "dtype": "bf16", "batch": 1, "tiny": args.smoke,
                          "results": results, "ratios_at_largest_context": summary, "plot": args.plot}, indent=2))
        return
    for name, rows in results.items():
        print(f"{name} (MiB, bf16, batch 1)")
        print(f"{'context':>8} {'owners+rings':>13} {'owners full':>12} {'every layer':>12}")
        for r in rows:
            print(f"{r['context']:>8} {r['owners_rings'] / 2**20:>13.1f} {r['owners_full'] / 2**20:>12.1f} "
                  f"{r['every_layer_full'] / 2**20:>12.1f}")


if __name__ == "__main__":
    main()
