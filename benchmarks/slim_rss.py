"""Peak host memory of a slim E2B host against the embedding bytes and the full model's.

A slim host keeps only what the device graphs do not: the word and per-layer embedding tables
(gathered on the host every step), the tokenizer and the sampling state. This writes a model
directory with the real E2B config and random bf16 embedding tables of the real shapes
(262,144 x 1,536 and 262,144 x 35*256: 5.5 GB), then measures, each in a fresh process, the
peak resident set (``ru_maxrss``) of loading the tables and running decode-step gathers:

* ``library``: :func:`neuron_port.graph.embedding.load_host_embeddings` (tables read straight into
  their final tensors);
* ``peer``: the same tables through ``safetensors.safe_open(...).get_tensor``, which (0.8) maps
  the file instead of loading it: its resident set counts only the pages the gathers touched,
  and every first touch of a row is a page fault into the file inside the decode loop.

    python benchmarks/slim_rss.py --json             # real E2B shapes (writes 5.5 GB to a temp dir)
    python benchmarks/slim_rss.py --smoke --json     # tiny config (CI)
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

_CHUNK = 32 * 2**20  # elements per write


def write_random_tables(path: Path, tables: dict[str, tuple[int, int]], seed: int = 0) -> int:
    """A safetensors file of random bf16 tables, streamed in chunks (never whole in memory)."""
    header, offset = {}, 0
    for name, shape in tables.items():
        size = shape[0] * shape[1] * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for shape in tables.values():
            left = shape[0] * shape[1]
            while left:
                n = min(left, _CHUNK)
                fh.write(torch.randn(n, generator=gen).bfloat16().view(torch.int16).numpy().tobytes())
                left -= n
    return offset


def child(model_dir: str, loader: str, steps: int) -> dict:
    """Runs in a fresh process: load the tables, run decode gathers, report memory."""
    import resource

    from neuron_port import load_config
    from neuron_port.families import family_for
    from neuron_port.graph.embedding import HostEmbeddings, load_host_embeddings
    from neuron_port.graph.scratch import DecodeScratch

    def rss() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    config = load_config(model_dir)
    before = rss()
    if loader == "library":
        emb = load_host_embeddings(model_dir, config)
    else:
        from safetensors import safe_open

        family = family_for(config.model_type)
        with safe_open(str(Path(model_dir) / "model.safetensors"), framework="pt") as fh:
            word = fh.get_tensor(family.word_embedding_key())
            key = family.per_layer_embedding_key()
            ple = fh.get_tensor(key) if key in fh.keys() else None
        emb = HostEmbeddings.for_config(config, word, ple)
    scratch = DecodeScratch(1, emb)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        scratch.fill(torch.randint(0, emb.word.shape[0], (1,), generator=gen), torch.tensor([1000 + step]))
    return {"loader": loader, "rss_before_load_bytes": before, "rss_after_bytes": rss(),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "embedding_bytes": emb.nbytes()}


def measure(model_dir: Path, loader: str, steps: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", str(model_dir), "--loader", loader, "--steps", str(steps)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{loader} child failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-4-e2b")
    ap.add_argument("--smoke", action="store_true", help="tiny config (a CI smoke run)")
    ap.add_argument("--steps", type=int, default=64, help="decode-step gathers after loading")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--loader", default="library", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.loader, args.steps)))
        return

    from neuron_port import describe, load_config
    from neuron_port.families import family_for
    from neuron_port.model.configs import config_to_dict

    config = load_config(args.model, tiny=args.smoke)
    layout = describe(config)
    family = family_for(config.model_type)
    tables = {family.word_embedding_key(): (layout.vocab_size, layout.hidden_size)}
    if layout.per_layer_input_size:
        tables[family.per_layer_embedding_key()] = (layout.vocab_size, layout.num_layers * layout.per_layer_input_size)
    with tempfile.TemporaryDirectory(prefix="slim_rss_") as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(config_to_dict(config)))
        emb_bytes = write_random_tables(model_dir / "model.safetensors", tables)
        library = measure(model_dir, "library", args.steps)
        peer = measure(model_dir, "peer", args.steps)
    full_bytes = layout.params.total * 2
    result = {
        "benchmark": "slim_rss",
        "model": args.model + (" (tiny)" if args.smoke else ""),
        "embedding_bytes": emb_bytes,
        "full_model_bytes_bf16": full_bytes,
        "library": library,
        "peer_safe_open": peer,
        "peak_rss_bytes": library["peak_rss_bytes"],
        "peak_over_embedding_bytes": round(library["peak_rss_bytes"] / emb_bytes, 3),
        "peak_over_full_model_bytes": round(library["peak_rss_bytes"] / full_bytes, 3),
        "peer_peak_over_embedding_bytes": round(peer["peak_rss_bytes"] / emb_bytes, 3),
        "peer_over_library_peak": round(peer["peak_rss_bytes"] / library["peak_rss_bytes"], 3),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['model']}: embeddings {emb_bytes / 2**30:.2f} GiB, full model {full_bytes / 2**30:.2f} GiB (bf16); "
              f"slim peak RSS {library['peak_rss_bytes'] / 2**30:.2f} GiB = {result['peak_over_embedding_bytes']}x the "
              f"embeddings; safe_open peer {peer['peak_rss_bytes'] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
