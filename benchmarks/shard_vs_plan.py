"""A real-width nxd shard's bytes per core against the planner's, for a model too large to shard whole here.

``neuron-port plan MODEL --tp N --json`` says what each NeuronCore will hold; ``compile --backend nxd`` writes
what it does hold (``weights/tp{r}_sharded_checkpoint.safetensors``). For the Gemma-4 12B the whole shard
needs more host memory than this machine has (random full-size weights are built in float32 before they
are quantized), so this keeps every width real (hidden, intermediate, heads, head sizes, the 262,144-word
head) and cuts the depth to ``--layers`` (the first layers of the model's own layer pattern: for the 12B,
five sliding layers and one full one), then, in one run:

* ``shard_bytes_per_core``: every core's shard, compiled in a fresh process on the stand-in SDK
  (``tests/support/sdk_standin``: ModelBuilder's calls and NxD's sharding by ``partition_dim``; TorchScript,
  not neuronx-cc, so the bytes are the checkpoint's, not a neff's);
* ``plan_weight_bytes_per_core``: the planner's figure for the same cut config (its peer, same run);
* ``full_plan_weight_bytes_per_core``: the planner's figure for the whole model, where the per-layer bytes the
  cut run checks are repeated over every layer;
* ``peak_rss_bytes``: the compile's peak resident set (``ru_maxrss`` of the child).

    python benchmarks/shard_vs_plan.py --json     # gemma-4-12b, 6 layers, tp 2, int8 + int8 head, bf16
    python benchmarks/shard_vs_plan.py --smoke --json   # the tiny 12B config (CI)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "support" / "sdk_standin"


def cut_config(model: str, layers: int, tiny: bool) -> dict:
    """The shipped config of ``model`` with its first ``layers`` decoder layers only (every width kept)."""
    from neuron_port.model.configs import load_config_dict, tiny_config_dict

    raw = load_config_dict(model)
    if tiny:
        raw = tiny_config_dict(raw)
    text = raw.get("text_config", raw)
    if layers > text["num_hidden_layers"]:
        raise SystemExit(f"--layers {layers}: {model} has {text['num_hidden_layers']} layers")
    text["num_hidden_layers"] = layers
    if "layer_types" in text:
        text["layer_types"] = text["layer_types"][:layers]
    return raw


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_port.cli.command", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT)


def main(argv: list[str] | None = None) -> dict:
    import os

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma-4-12b", help="a shipped model name (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=6, help="decoder layers kept (default: %(default)s)")
    parser.add_argument("--tp", type=int, default=2, help="NeuronCores (default: %(default)s)")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"], help="default: %(default)s")
    parser.add_argument("--no-quant", action="store_true", help="float projections instead of int8 + int8 head")
    parser.add_argument("--smoke", action="store_true", help="the tiny config, 2 layers (CI)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    layers = 2 if args.smoke else args.layers
    quant = [] if args.no_quant else ["--quant", "int8", "--quant-head"]
    common = ["--tp", str(args.tp), "--dtype", args.dtype, *quant]
    with tempfile.TemporaryDirectory(prefix="shard-vs-plan-") as work:
        config = Path(work) / f"{args.model}-{layers}-layers.json"
        config.write_text(json.dumps(cut_config(args.model, layers, args.smoke)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDIN), str(ROOT)]))
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        built = _cli("compile", str(config), "--random-weights", "--backend", "nxd", *common, "--buckets", "128",
                     "--kv-lens", "256", "--out", str(Path(work) / "artifact"), "--json", env=env)
        if built.returncode != 0:
            raise SystemExit(built.stderr[-3000:])
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        summary = json.loads(built.stdout)
        planned = _cli("plan", str(config), *common, "--context", "256", "--json")
        full = _cli("plan", args.model, *(["--tiny"] if args.smoke else []), *common, "--json")
    for res in (planned, full):
        if res.returncode != 0:
            raise SystemExit(res.stderr[-3000:])
    cut_plan = json.loads(planned.stdout)["per_core_bytes"]["weights"]
    out = {
        "model": args.model, "layers": layers, "tp": args.tp, "dtype": args.dtype, "quant": summary["quant"],
        "shard_bytes_per_core": summary["shard_bytes_per_core"],
        "plan_weight_bytes_per_core": cut_plan,
        "compile_summary_plan_weight_bytes_per_core": summary["plan_weight_bytes_per_core"],
        "shard_to_plan": round(max(summary["shard_bytes_per_core"]) / cut_plan, 6),
        "full_plan_weight_bytes_per_core": json.loads(full.stdout)["per_core_bytes"]["weights"],
        "peak_rss_bytes": max(peak, before) * 1024,
    }
    print(json.dumps(out, indent=2 if args.json else None))
    return out


if __name__ == "__main__":
    main()
