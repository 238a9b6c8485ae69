"""Artifact bytes and generate's peak memory against the checkpoint and Hugging Face's own.

An artifact holds a rank's weights once for all its graphs (:mod:`neuron_port.backends.weight_pool`):
its bytes should be the weights' plus code, whatever the bucket count, and a process that
loads it and generates should hold about what Hugging Face's ``from_pretrained`` + ``generate``
holds for the same checkpoint. For each model this compiles an artifact with four prompt
buckets and one KV length (``neuron-port compile DIR --backend cpu``), then measures, each in
a fresh process, the peak resident set (``ru_maxrss``) of

* ``library``: ``neuron-port generate ARTIFACT`` (verified, loaded, N greedy tokens);
* ``peer``: ``AutoModelForCausalLM.from_pretrained(DIR)`` and ``generate`` of the same prompt.

    python benchmarks/weights_once.py --json                         # SmolLM2-135M (real weights) and the tiny E2B
    python benchmarks/weights_once.py --models smollm2-135m --json   # one of them (the test suite's run)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUCKETS = "16,32,64,128"
KV_LEN = "256"
PROMPT_LEN = 12


def _tree_bytes(path: Path, pattern: str = "**/*") -> int:
    return sum(p.stat().st_size for p in path.glob(pattern) if p.is_file())


def _child_library(artifact: str, new_tokens: int) -> dict:
    from neuron_port.cli.command import main as cli

    start = time.perf_counter()
    code = cli(["generate", artifact, "--prompt-len", str(PROMPT_LEN), "--max-new-tokens", str(new_tokens), "--json"])
    return {"rc": code, "seconds": time.perf_counter() - start}


def _child_peer(model_dir: str, new_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(3, int(model.config.vocab_size), (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return {"rc": 0, "seconds": time.perf_counter() - start}


def _measure(kind: str, target: str, new_tokens: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, target, "--new-tokens", str(new_tokens)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} child failed on {target}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tiny_e2b_dir(root: Path) -> Path:
    from neuron_port.model.loading import model_from_name
    from neuron_port.model.localdir import write_tokenizer

    model = model_from_name("gemma-4-e2b", tiny=True, seed=0)
    out = root / "tiny-e2b"
    model.save_pretrained(out)
    write_tokenizer(out, model.config.get_text_config().vocab_size)
    return out


def bench_model(name: str, model_dir: Path, work: Path, new_tokens: int) -> dict:
    artifact = work / f"{name}.artifact"
    compile_cmd = [sys.executable, "-m", "neuron_port", "compile", str(model_dir), "--backend", "cpu", "--out", str(artifact),
                   "--buckets", BUCKETS, "--kv-lens", KV_LEN, "--json"]
    proc = subprocess.run(compile_cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"compile failed on {model_dir}: {proc.stderr[-2000:]}")
    weights = _tree_bytes(model_dir, "*.safetensors")
    total = _tree_bytes(artifact)
    library = _measure("library", str(artifact), new_tokens)
    peer = _measure("peer", str(model_dir), new_tokens)
    return {
        "model": name,
        "graphs": len(BUCKETS.split(",")) + 1,
        "weights_bytes": weights,
        "artifact_bytes": total,
        "artifact_weight_files_bytes": _tree_bytes(artifact, "**/*.safetensors"),
        "artifact_over_weights": round(total / weights, 4),
        "library_peak_rss_bytes": library["peak_rss_bytes"],
        "peer_peak_rss_bytes": peer["peak_rss_bytes"],
        "rss_over_peer": round(library["peak_rss_bytes"] / peer["peak_rss_bytes"], 4),
        "library_seconds": round(library["seconds"], 2),
        "peer_seconds": round(peer["seconds"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma-4-e2b-tiny", help="comma-separated: smollm2-135m, gemma-4-e2b-tiny")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import resource

        kind, target = args.child
        out = (_child_library if kind == "library" else _child_peer)(target, args.new_tokens)
        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print("\n" + json.dumps(out))
        return

    results = []
    with tempfile.TemporaryDirectory(prefix="weights_once_") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            if name == "smollm2-135m":
                from neuron_port.model.pretrained import pretrained_dir

                results.append(bench_model(name, pretrained_dir(name), work, args.new_tokens))
            elif name == "gemma-4-e2b-tiny":
                results.append(bench_model(name, _tiny_e2b_dir(work), work, args.new_tokens))
            else:
                raise SystemExit(f"error: --models: expected smollm2-135m or gemma-4-e2b-tiny, found {name!r}")
    report = {"benchmark": "weights_once", "buckets": BUCKETS, "kv_len": int(KV_LEN), "new_tokens": args.new_tokens,
              "models": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for r in results:
            print(f"{r['model']}: artifact {r['artifact_bytes'] / 1e6:.1f} MB = {r['artifact_over_weights']}x the weights; "
                  f"generate peak RSS {r['library_peak_rss_bytes'] / 1e9:.2f} GB = {r['rss_over_peer']}x Hugging Face's")


if __name__ == "__main__":
    main()
