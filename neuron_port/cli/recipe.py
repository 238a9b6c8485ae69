"""What every port recipe does the same way: its command line, validating the shipped artifact, serving it.

A recipe (see ``examples/``) tells the story of one port; these helpers keep the parts that
are identical for every model out of that story.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_port.checks.checked_run import CheckedRun


def recipe_parser(description: str, tp: int | None = None) -> argparse.ArgumentParser:
    """The standard recipe options: real weights or tiny, backend, TP degree, target, output, lengths, serve.

    ``--tp`` defaults to ``tp``; None means the capacity planner's recommendation (a recipe plans at
    ``--tp`` and uses the degree the plan was made at)."""
    from neuron_port.cli.help_format import DefaultsShown
    from neuron_port.cli.quant_flags import QuantFlagsParser, add_quant_option

    ap = QuantFlagsParser(description=description, formatter_class=DefaultsShown)
    ap.add_argument("--model-dir", help="real weights: a local model directory or a Hugging Face id through the hub "
                                        "cache (default: tiny random weights)")
    ap.add_argument(
        "--backend",
        default="cpu",
        choices=["cpu", "neuron", "nxd", "xla"],
        help="cpu, neuron (one NeuronCore) or nxd (any tp), both through neuronx-distributed's ModelBuilder: a verified "
        "artifact, checked in a fresh process; xla: the graphs lowered through torch-xla "
        "(PJRT_DEVICE=CPU) and checked in this process",
    )
    ap.add_argument("--tp", type=int, default=tp, help="tensor-parallel degree" + ("" if tp is not None else
                    " (default: the planner's recommendation)"))
    ap.add_argument("--target", default="inf2.xlarge", help="planner target (inf2.xlarge, inf2.8xlarge, custom:...)")
    ap.add_argument("--out", help="directory for the artifact (default: a temporary one)")
    ap.add_argument("--prompt-len", type=int, default=24, help="random prompt of N tokens (BOS first)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="new tokens to generate and check")
    ap.add_argument("--serve", action="store_true", help="serve the artifact over HTTP afterwards")
    ap.add_argument(
        "--dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="dtype of the graphs, weights and KV store (Inferentia2 runs bf16; the check's logit bound follows the dtype)",
    )
    add_quant_option(ap, what="int8: weight-only int8 projections (per output channel, fp32 scales; the LM head too with "
                     "--quant-head), checked against the same quantized model (every backend)")
    return ap


def run_recipe(main: Callable[[], int | None]) -> int:
    """``main()``'s exit code, a library error printed as one ``error:`` line (exit 2), as the command prints it."""
    from neuron_port.errors import NeuronPortError

    try:
        return int(main() or 0)
    except (NeuronPortError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def load_checked(name: str, model_dir: str | None, dtype: str = "fp32", quant: str = "none") -> tuple[Any, dict[str, Any]]:
    """Real weights from ``model_dir`` (every parameter and buffer checked against transformers'
    own ``from_pretrained``, quantized the same way) or tiny random ones, in ``dtype`` (``fp32`` or
    ``bf16``), weights in ``quant`` (:data:`~neuron_port.model.quant.QUANT_SCHEMES`).

    Returns the model and its source record; prints which tensors, if any, differ."""
    from neuron_port.model.hub import resolve_model
    from neuron_port.model.loading import load_source, parse_dtype

    if model_dir:
        model_dir = resolve_model(model_dir)  # a hub id becomes its cached snapshot directory
    model, source = load_source(model_dir or name, tiny=model_dir is None, dtype=parse_dtype(dtype), quant=quant)
    if model_dir:
        from neuron_port.checks.loader_check import loader_mismatches
        from neuron_port.checks.reference import reference_for_source

        problems = loader_mismatches(model, reference_for_source(model_dir, quant=quant))
        print(f"[load] tensors differing from transformers' from_pretrained: {[str(p) for p in problems] or 'none'}")
    else:
        print("[load] buffers differing from the checkpoint: none")
    return model, source


def validate_and_report(artifact: str | Path, prompt_len: int, max_new_tokens: int) -> CheckedRun:
    """Reload the artifact in a fresh process, compare with Hugging Face on CPU, print ``SEQ_MATCH``."""
    from neuron_port.checks.validation import check_in_fresh_process

    checked = check_in_fresh_process(artifact, prompt_len, max_new_tokens)
    run = checked.run
    print(f"[reload] a fresh process loaded {run['artifact']} (backend {run['backend']}, tp {run['tp']})")
    print(f"[check] {run['new_tokens']} tokens against Hugging Face generate; this run decoded "
          f"{run['decode_tok_per_s']} tok/s on the {run['backend']} backend")
    for check in checked.checks:
        print(f"[self-check] {check.name}: {check.status}, {check.detail}")
    print(f"SEQ_MATCH {checked.seq_match}")
    return checked


def artifact_dir(args: argparse.Namespace, prefix: str) -> Path:
    """Where a recipe writes its artifact: ``--out``/artifact, or a fresh temporary directory's."""
    import tempfile

    return Path(args.out or tempfile.mkdtemp(prefix=prefix)) / "artifact"


def validate_then_serve(artifact: str | Path, args: argparse.Namespace) -> int:
    """The last steps of every recipe: the fresh-process check (prints ``SEQ_MATCH``), then the
    server if ``--serve`` was given. Returns the recipe's exit code (0 when the tokens match)."""
    checked = validate_and_report(artifact, args.prompt_len, args.max_new_tokens)
    if args.serve:
        serve_artifact(artifact)
    return 0 if checked.passed else 1


def check_on_xla(model: Any, setup: Any, shape: Any, args: argparse.Namespace) -> int:
    """The recipe's last steps on the XLA path: lower and run every graph through torch-xla (SPMD at
    tp > 1), compare with Hugging Face, print the lowering and ``SEQ_MATCH``; the exit code."""
    from neuron_port.checks.validation import compare_with_reference
    from neuron_port.checks.xla_lint import format_lowering, lowering_result
    from neuron_port.generation.generate import generate
    from neuron_port.generation.prompts import random_prompt
    from neuron_port.generation.request import GenerationRequest

    family = setup.layout.family
    prompt = random_prompt(setup.layout.vocab_size, args.prompt_len, bos=family.special_ids(family.text_config_of(model)).bos)
    got = generate(model, GenerationRequest.greedy([prompt], args.max_new_tokens), shape=shape, setup=setup, backend="xla")
    match = compare_with_reference(got.tokens[0], model, prompt, args.max_new_tokens)
    lowering = lowering_result(setup.layout.model_type, setup.tp, got.lowering)
    print("\n".join(f"[xla] {line}" for line in format_lowering(lowering).splitlines()))
    print(f"SEQ_MATCH {match.seq_match}")
    return 0 if match.seq_match else 1


def serve_artifact(artifact: str | Path, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve a verified artifact with the OpenAI-compatible server (needs the ``serve`` extra)."""
    from neuron_port.serve import build_app, load_served, serve

    serve(build_app(lambda: load_served(str(artifact))), host=host, port=port)


__all__ = [
    "recipe_parser",
    "run_recipe",
    "check_on_xla",
    "load_checked",
    "artifact_dir",
    "validate_and_report",
    "validate_then_serve",
    "serve_artifact",
]
