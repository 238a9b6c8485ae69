"""Host work per decode step at real Gemma-4 dimensions, against a straightforward peer.

Measures, for a 262,144-entry vocabulary: sampling with top-k/top-p through the library's
fast path vs the dense reference (softcap and sort over the whole vocabulary); and the
decode-step host inputs (embeddings, position ids, lengths: the graphs build their masks and
one-hot writes from the lengths) written into preallocated tensors, against building the
embeddings, masks and writes fresh on the host each step (what the port's host did before its
graphs built their own maps). Prints JSON with ratios.

    python benchmarks/host_step.py [--vocab 262144] [--kv-len 2048] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from neuron_port.generation.sampling import SamplingParams, filtered_distribution, reference_distribution
from neuron_port.graph import masks
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.scratch import DecodeScratch


def _time(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--kv-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    logits = torch.randn(args.vocab) * 8
    params = SamplingParams(temperature=0.8, top_k=64, top_p=0.95)
    fast = _time(lambda: filtered_distribution(logits, params, 30.0), args.repeats)
    dense = _time(lambda: reference_distribution(logits, params, 30.0), args.repeats)
    greedy = _time(lambda: torch.argmax(logits), args.repeats)
    pos = torch.tensor([1000])
    step_inputs = _time(
        lambda: (
            masks.decode_masks(pos, args.kv_len, args.window, args.window),
            masks.decode_writes(pos, args.kv_len, args.window),
        ),
        args.repeats,
    )
    # Whole decode-step host inputs at E2B's real widths (hidden 1536, 35 layers x 256 per-layer
    # inputs, bf16 tables); the tables hold 32,768 rows here, since a gather's cost does not depend
    # on how many rows it could have picked.
    rows, hidden, layers, per_layer = 32768, 1536, 35, 256
    emb = HostEmbeddings(
        torch.randn(rows, hidden).bfloat16(),
        torch.randn(rows, layers * per_layer).bfloat16(),
        layers,
        per_layer,
        hidden**0.5,
        per_layer**0.5,
    )
    scratch = DecodeScratch(1, emb)
    tok = torch.tensor([123])

    def fresh():
        emb.embed(tok[:, None])
        masks.decode_masks(pos, args.kv_len, args.window, args.window, torch.bfloat16)
        masks.decode_writes(pos, args.kv_len, args.window, torch.bfloat16)

    preallocated_ms = _time(lambda: scratch.fill(tok, pos), args.repeats)
    fresh_ms = _time(fresh, args.repeats)
    print(
        json.dumps(
            {
                "vocab": args.vocab,
                "sampling_ms": {
                    "library_topk_topp": round(fast, 3),
                    "dense_reference": round(dense, 3),
                    "ratio_reference_over_library": round(dense / fast, 2),
                    "greedy_argmax": round(greedy, 3),
                },
                "decode_masks_and_writes_ms": round(step_inputs, 4),
                "decode_host_inputs_ms": {
                    "preallocated": round(preallocated_ms, 4),
                    "fresh_tensors": round(fresh_ms, 4),
                    "ratio_fresh_over_preallocated": round(fresh_ms / preallocated_ms, 2),
                },
                "kv_len": args.kv_len,
                "threads": torch.get_num_threads(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
