"""Host work per decode step at real Gemma-4 dimensions, against a straightforward peer.

Measures, for a 262,144-entry vocabulary: sampling with top-k/top-p through the library's
fast path vs the dense reference (softcap and sort over the whole vocabulary), and the
decode-step host inputs (masks and one-hot writes) for a KV length. Prints JSON with ratios.

    python benchmarks/host_step.py [--vocab 262144] [--kv-len 2048] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from neuron_port import masks
from neuron_port.sampling import SamplingParams, filtered_distribution, reference_distribution


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
        lambda: (masks.decode_masks(pos, args.kv_len, args.window, args.window), masks.decode_writes(pos, args.kv_len, args.window)),
        args.repeats,
    )
    print(json.dumps({
        "vocab": args.vocab,
        "sampling_ms": {"library_topk_topp": round(fast, 3), "dense_reference": round(dense, 3),
                        "ratio_reference_over_library": round(dense / fast, 2), "greedy_argmax": round(greedy, 3)},
        "decode_masks_and_writes_ms": round(step_inputs, 4),
        "kv_len": args.kv_len,
        "threads": torch.get_num_threads(),
    }, indent=2))


if __name__ == "__main__":
    main()
