"""Host work per decode step at real Gemma-4 dimensions, against a straightforward peer.

Measures, for a 262,144-entry vocabulary: sampling with top-k/top-p through the library's
fast path vs the dense reference (softcap and sort over the whole vocabulary); and the
decode-step host inputs (embeddings, position ids, lengths: the graphs build their masks and
one-hot writes from the lengths) written into preallocated tensors, against building the
embeddings, masks and writes fresh on the host each step (what the port's host did before its
graphs built their own maps). Prints JSON with ratios.

It also measures what one step sends from the host at E2B's real shapes (a prompt bucket of
``--bucket`` tokens prefilled into a store of ``--store-kv-len`` positions, and a decode step at that
length, bf16): the library's step inputs, against the host-built masks and one-hot write maps the
graphs took before they built their own (same embeddings), in bytes and in milliseconds to build.

    python benchmarks/host_step.py [--vocab 262144] [--kv-len 2048] [--repeats 20]
                                   [--bucket 2048] [--store-kv-len 32768]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from neuron_port import describe, load_config
from neuron_port.generation.sampling import SamplingParams, filtered_distribution, reference_distribution
from neuron_port.graph import masks
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.host_inputs import HostInputs
from neuron_port.graph.scratch import DecodeScratch
from neuron_port.graph.shapes import PortShape, StoreShapes


def _time(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def step_payload(emb: HostEmbeddings, bucket: int, kv_len: int, repeats: int) -> dict:
    """Bytes one prefill (a full ``bucket``) and one decode step at ``kv_len`` send from the host, and
    the ms to build them: the library's inputs against the host-built maps of the same step."""
    config = load_config("gemma-4-e2b")
    layout = describe(config)
    stores = StoreShapes.of(layout, PortShape([bucket], [kv_len]))
    inputs = HostInputs(layout, stores, emb)
    ids, lengths = torch.randint(0, emb.word.shape[0], (1, bucket)), torch.tensor([bucket])
    positions = torch.arange(bucket)[None]
    spec, dtype = stores.specs[kv_len], emb.word.dtype

    def host_maps_prefill():
        embeds = emb.embed(ids)
        return (*embeds, positions, *masks.prefill_masks(positions, spec.window, dtype),
                *masks.prefill_writes(positions, lengths, kv_len, spec.ring, dtype),
                masks.last_token_onehot(positions, lengths, dtype))

    last = torch.tensor([kv_len - 1])

    def host_maps_decode():
        embeds = emb.embed(ids[:, :1])
        return (*embeds, last[:, None], *masks.decode_masks(last, kv_len, spec.window, spec.ring, dtype),
                *masks.decode_writes(last, kv_len, spec.ring, dtype), torch.ones(1, 1, dtype=dtype))

    def row(library, peer) -> dict:
        ours, theirs = _nbytes(library()), _nbytes(peer())
        return {"library_bytes": ours, "host_maps_bytes": theirs, "ratio_host_maps_over_library": round(theirs / ours, 2),
                "library_ms": round(_time(library, repeats), 3), "host_maps_ms": round(_time(peer, repeats), 3)}

    return {"bucket": bucket, "kv_len": kv_len, "dtype": str(dtype).removeprefix("torch."),
            "prefill": row(lambda: inputs.prefill(ids, lengths, bucket), host_maps_prefill),
            "decode": row(lambda: inputs.decode_fresh(ids[0, :1], last), host_maps_decode)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--kv-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--bucket", type=int, default=2048, help="prompt bucket of the step-payload figures")
    ap.add_argument("--store-kv-len", type=int, default=32768, help="KV length of the step-payload figures")
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
    payload = step_payload(emb, args.bucket, args.store_kv_len, max(2, args.repeats // 4))
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
                "step_payload": payload,
                "threads": torch.get_num_threads(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
