"""Peak host memory of tracing an nxd artifact's graphs, against the model's weight bytes.

ModelBuilder calls each graph key's ``load_module`` and keeps every module it built until the trace
ends, so whatever each key copies stays resident once per key. This measures, each in a fresh
process on the stand-in SDK (``tests/support/sdk_standin``: ModelBuilder's calls, TorchScript instead of
neuronx-cc), the peak resident set (``ru_maxrss``) that ``write_nxd_rank`` adds above the process
that already holds the model:

* ``library``: each key traces a :func:`neuron_port.backends.nxd.device_copy` (host tables dropped,
  projections never copied, every other tensor shared with the model);
* ``peer``: each key deep-copies the whole model first and keeps its tables resident, as the
  backend did before (the traced module is the same, so both write the same artifact).

The model is Gemma-4 E2B's architecture at a small width with a real-sized share of embedding
tables (E2B: 2.75 B of its 4.63 B parameters are the word and per-layer tables). NxD's own parallel
layers allocate their weights on every key in both runs. Not a device figure.

    python benchmarks/nxd_build_memory.py --json             # vocab 65,536, four graph keys
    python benchmarks/nxd_build_memory.py --smoke --json     # tiny config (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _model(smoke: bool):
    from neuron_port.families import family_for
    from neuron_port.model.configs import load_config_dict, tiny_config_dict
    from neuron_port.model.loading import build_model

    text = tiny_config_dict(load_config_dict("gemma-4-e2b"))
    if not smoke:
        text.update(vocab_size=65536, vocab_size_per_layer_input=65536, hidden_size=256, intermediate_size=512,
                    hidden_size_per_layer_input=64)
    return build_model(family_for("gemma4_text").make_config(text), seed=0)


def _deep_copy_per_key(model):
    """The earlier factory's residency: each key deep-copied the model and kept, beside NxD's new
    projections, its own word and per-layer tables (the head tied to the word table). Built here
    from the same device module the library traces, so both runs write the same artifact."""
    import copy

    from neuron_port.backends import nxd

    clone = copy.deepcopy(model)
    device = nxd.device_copy(clone)  # the head shares the clone's word table; the clone's projections are freed
    device.kept_by_the_earlier_factory = [clone.model.embed_tokens, clone.model.embed_tokens_per_layer]
    return device


def child(way: str, smoke: bool) -> dict:
    """Runs in a fresh process: build the model, then write the nxd rank; peak RSS before and after."""
    import resource

    from neuron_port.backends import nxd_artifact
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import checkpoint_state
    from neuron_port.parallel.ranks import RankSetup

    model = _model(smoke)
    setup = RankSetup.for_layout(describe(model), 1)
    weight_bytes = sum(t.numel() * t.element_size() for t in checkpoint_state(model, clone=False).values())
    if way == "peer":
        nxd_artifact.device_copy = _deep_copy_per_key
    buckets = (8, 16, 32) if not smoke else (8,)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with tempfile.TemporaryDirectory() as tmp:
        nxd_artifact.write_nxd_rank(Path(tmp) / "rank0", model, setup, PortShape(buckets, 64), 1)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"way": way, "graph_keys": len(buckets) + 1, "weight_bytes": weight_bytes, "peak_rss_before": before,
            "peak_rss_after": after, "build_added_bytes": after - before}


def measure(way: str, smoke: bool) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "support" / "sdk_standin"), str(ROOT)])
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import nxd_build_memory as b; "
            f"print(json.dumps(b.child({way!r}, {smoke!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the {way} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the tiny config (CI)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    library, peer = measure("library", args.smoke), measure("peer", args.smoke)
    weights = library["weight_bytes"]
    out = {
        "benchmark": "nxd_build_memory",
        "model": "gemma-4-e2b architecture" + (" (tiny)" if args.smoke else ", vocab 65536, hidden 256"),
        "graph_keys": library["graph_keys"],
        "weight_bytes": weights,
        "library_build_added_bytes": library["build_added_bytes"],
        "peer_build_added_bytes": peer["build_added_bytes"],
        "library_added_to_weights": round(library["build_added_bytes"] / weights, 3),
        "peer_added_to_weights": round(peer["build_added_bytes"] / weights, 3),
        "library_to_peer": round(library["build_added_bytes"] / max(peer["build_added_bytes"], 1), 3),
    }
    print(json.dumps(out, indent=2 if not args.json else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
