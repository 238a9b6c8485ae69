"""Host work per decode token at real Gemma-4 E2B dimensions, with the device graph faked.

The device's graph time belongs to the device; everything else in a decode step is this
library's: embedding gathers (word and 35 x 256 per-layer rows), positions, masks and one-hot
KV writes for the real store (owners only, 512-slot rings for sliding owners), the graph call,
sampling over the 262,144-entry vocabulary, stop checks. The graph is replaced by a call that
returns correctly shaped outputs instantly (preallocated logits, the KV store handed back as
the device's aliasing would), so the loop's wall time per token is the host overhead.

Compared in the same run with a straightforward peer loop: fresh input tensors every step and
dense sampling (softcap, sort and nucleus walk over the whole vocabulary). The embedding tables
have the real shapes (4.7 GB of per-layer rows in bf16) but are allocated without being
written: only the gathered rows are ever touched.

    python benchmarks/host_overhead.py --json            # E2B dimensions, 64 tokens
    python benchmarks/host_overhead.py --smoke --json    # tiny settings (CI)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from neuron_port import describe, load_config
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationParams, GenerationRequest
from neuron_port.generation.sampling import SamplingParams, reference_distribution
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.port import Port
from neuron_port.graph.runners import Runners
from neuron_port.graph.shapes import PortShape
from neuron_port.graph.step import INPUT_NAMES

DEVICE_STEP_MS_ANCHOR = 23.0  # field report: E2B decode on one NeuronCore, ~23 ms per token
SAMPLED = SamplingParams(temperature=1.0, top_k=64, top_p=0.95)


class FakeDevice:
    """A graph stand-in: returns preallocated logits [batch, vocab] and the KV store it was given."""

    def __init__(self, batch: int, vocab: int, seed: int = 0):
        self.logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 4

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        return [self.logits, *inputs[len(INPUT_NAMES):]]


def build_port(name: str, tiny: bool, context: int, new_tokens: int) -> Port:
    config = load_config(name, tiny=tiny)
    layout = describe(config)
    ple = layout.per_layer_input_size
    word = torch.empty(layout.vocab_size, layout.hidden_size, dtype=torch.bfloat16)
    table = torch.empty(layout.vocab_size, layout.num_layers * ple, dtype=torch.bfloat16) if ple else None
    embeddings = HostEmbeddings.for_config(config, word, table)
    kv_len = 1 << (context + new_tokens - 1).bit_length()
    device = FakeDevice(1, layout.vocab_size)
    stores = PortShape([context], [kv_len]).stores(layout)
    return Port.from_runners(layout, stores, embeddings, Runners({context: device}, {kv_len: device}, None, compiled=True))


def library_ms_per_token(port: Port, prompt: list[int], tokens: int, sampling: SamplingParams) -> float:
    request = GenerationRequest([prompt], GenerationParams(max_new_tokens=tokens, sampling=sampling, seed=0))
    generate(port, request)  # warm-up: allocates the decode scratch once
    run = generate(port, request)
    return run.decode_s / run.decode_steps * 1e3


def peer_ms_per_token(port: Port, prompt: list[int], tokens: int, sampling: SamplingParams) -> float:
    """Fresh tensors every step; greedy argmax or dense sampling over the whole vocabulary."""
    kv = port.kv_len
    store = port.inputs.new_store(1, kv).tensors()
    runner = port.runners.decode[kv]
    gen = torch.Generator().manual_seed(0)
    pos, tok = len(prompt), torch.tensor([prompt[-1]])
    start = time.perf_counter()
    for _ in range(tokens):
        out = runner(*port.inputs.decode_fresh(tok, torch.tensor([pos])), *store)
        logits, store = out[0][0], list(out[1:])
        if sampling.greedy:
            tok = torch.argmax(logits)[None]
        else:
            probs = reference_distribution(logits, sampling, port.layout.softcap)
            tok = torch.multinomial(probs, 1, generator=gen)
        pos += 1
    return (time.perf_counter() - start) / tokens * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-4-e2b")
    ap.add_argument("--context", type=int, default=1024, help="prompt length before decoding")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps timed")
    ap.add_argument("--smoke", action="store_true", help="tiny config, few tokens (a CI smoke run)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tiny = args.smoke
    context, tokens = (16, 4) if args.smoke else (args.context, args.tokens)
    port = build_port(args.model, tiny, context, tokens + 1)
    prompt = [2] + list(range(3, 3 + context - 1))
    greedy = library_ms_per_token(port, prompt, tokens + 1, SamplingParams())
    sampled = library_ms_per_token(port, prompt, tokens + 1, SAMPLED)
    peer_greedy = peer_ms_per_token(port, prompt, tokens, SamplingParams())
    peer_sampled = peer_ms_per_token(port, prompt, tokens, SAMPLED)
    layout = port.layout
    result = {
        "benchmark": "host_overhead",
        "model": args.model + (" (tiny)" if tiny else ""),
        "vocab": layout.vocab_size,
        "per_layer_inputs": [layout.num_layers, layout.per_layer_input_size],
        "kv_len": port.kv_len,
        "context": context,
        "tokens": tokens,
        "threads": torch.get_num_threads(),
        "greedy_ms_per_token": round(greedy, 4),
        "sampled_ms_per_token": round(sampled, 4),
        "device_step_ms_anchor": DEVICE_STEP_MS_ANCHOR,
        "greedy_ratio_to_anchor": round(greedy / DEVICE_STEP_MS_ANCHOR, 4),
        "sampled_ratio_to_anchor": round(sampled / DEVICE_STEP_MS_ANCHOR, 4),
        "peer_greedy_ms_per_token": round(peer_greedy, 4),
        "peer_sampled_ms_per_token": round(peer_sampled, 4),
        "peer_over_library_greedy": round(peer_greedy / greedy, 2),
        "peer_over_library_sampled": round(peer_sampled / sampled, 2),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['model']}: host per token greedy {greedy:.3f} ms ({result['greedy_ratio_to_anchor']:.1%} of the "
              f"{DEVICE_STEP_MS_ANCHOR:g} ms device step), sampled {sampled:.3f} ms ({result['sampled_ratio_to_anchor']:.1%}); "
              f"peer loop {peer_greedy:.3f} / {peer_sampled:.3f} ms")


if __name__ == "__main__":
    main()
