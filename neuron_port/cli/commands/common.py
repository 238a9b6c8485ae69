"""Helpers every command shares: JSON output, integer lists, prompts from arguments, generation reports."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_port.checks.checked_run import CheckedRun
    from neuron_port.generation.opened import OpenedModel


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


MODEL_HELP = ("a Hugging Face model id (google/gemma-4-E2B-it: through the hub cache; HF_HUB_OFFLINE, HF_TOKEN and "
              "HF_HOME are read), a local model directory (config.json + safetensors), a config.json, or a shipped "
              "name (random weights: with --tiny)")


def add_model_source_options(p: argparse.ArgumentParser, weights: bool) -> None:
    """``--revision`` (a hub id's branch, tag or commit) and, for a command that builds weights, ``--random-weights``
    (a shipped name or config.json at full size with random weights, which is refused without it)."""
    p.add_argument("--revision", default=None, help="a Hugging Face id's branch, tag or commit (default: main)")
    if weights:
        p.add_argument("--random-weights", action="store_true",
                       help="build a shipped name or config.json at its full size with random weights (memory and "
                            "speed trials only: the output is noise); without it a model given by config needs --tiny")


def resolve_model_argument(args: argparse.Namespace) -> None:
    """``args.model`` as the loaders take it (a hub id becomes its snapshot directory), resolved once; and, for a
    command that builds weights, a full-size config without weights refused unless ``--random-weights``."""
    from neuron_port.errors import ModelSourceError
    from neuron_port.model.configs import HUB_IDS, SHIPPED
    from neuron_port.model.hub import resolve_model

    args.model_as_given = args.model  # a hub id stays the name a server answers to
    args.model = resolve_model(args.model, getattr(args, "revision", None))
    is_config = args.model in SHIPPED or Path(args.model).is_file()  # anything else: a directory, or the loader says
    if not hasattr(args, "random_weights") or not is_config or args.tiny or args.random_weights:
        return
    real = f" (its real weights: {HUB_IDS[args.model]})" if args.model in HUB_IDS else ""
    raise ModelSourceError(f"{args.model} is a config, not weights{real}: give a Hugging Face id or a local model "
                           "directory for real weights, --tiny for a small random model, or --random-weights for random "
                           "weights at full size")


def int_list(text: str) -> list[int]:
    """argparse type: ``"32,64,128"`` -> [32, 64, 128] (positive integers)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, found {text!r}")
    return values


def rate_list(text: str) -> list[float]:
    """argparse type: ``"0.5,0.7"`` -> [0.5, 0.7] (rates in [0, 1])."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates, found {text!r}") from None
    if not values or not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected rates in [0, 1], found {text!r}")
    return values


def prompt_from_args(args: argparse.Namespace, opened: OpenedModel) -> list[int]:
    """``--chat MESSAGE`` through the model's chat format, ``--prompt TEXT`` tokenised with its
    tokenizer.json (special tokens as the tokenizer adds them), or ``--prompt-len`` seeded random
    ids with BOS first."""
    if getattr(args, "chat", None) is not None:
        return opened.chat_prompt(args.chat)
    if args.prompt is not None:
        return opened.text_prompt(args.prompt)
    return opened.random_prompt(args.prompt_len, args.seed)


def context_warning(out: dict[str, Any], asked: int | None) -> str | None:
    """The one line that says a run stopped at the end of its context before the new tokens asked for (None if
    it did not): its ``finish_reason`` is ``length`` either way, and a shorter answer than asked would be silent."""
    made = out.get("new_tokens")
    if asked is None or made is None or made >= asked or out.get("finish_reason") != "length":
        return None
    return (f"warning: stopped at the end of the context after {made} of the {asked} new tokens asked for (prompt "
            f"{out.get('prompt_tokens', '?')} tokens); build with a longer KV length (--kv-len, --kv-lens) for more")


class TextStream:
    """Prints the first row's text to stdout as its tokens are made (``generate(..., on_token=stream)``), for a
    person reading a text prompt's answer; ``streamed`` says whether anything went out."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.streamed = tokenizer, False

    def __call__(self, event: Any) -> None:
        if event.row == 0 and event.text:
            print(event.text, end="", flush=True)
            self.streamed = True


def text_stream(args: argparse.Namespace, opened: OpenedModel) -> TextStream | None:
    """A :class:`TextStream` over the model's tokenizer for a text prompt (``--prompt``, ``--chat``) printed for
    people; None for ``--json``, a random prompt or a model without a tokenizer."""
    if args.json or (getattr(args, "prompt", None) is None and getattr(args, "chat", None) is None):
        return None
    return TextStream(opened.tokenizer) if opened.tokenizer is not None else None


def summary_line(out: dict[str, Any]) -> str:
    """One line of what a run did: tokens, why it stopped, how fast, where."""
    return (f"[{out.get('new_tokens')} new tokens after a {out.get('prompt_tokens')}-token prompt, finish "
            f"{out.get('finish_reason')}; prefill {out.get('prefill_s', 0):.3f} s, decode {out.get('decode_tok_per_s')} "
            f"tok/s; backend {out.get('backend')}, tp {out.get('tp')}; --json for everything]")


def emit_generation(checked: CheckedRun, args: argparse.Namespace, stream: TextStream | None = None) -> int:
    """Print a generation result (``checked.run``, with what ``--check`` found): JSON with ``--json``; else the text
    (already streamed, or printed now), the tokens of a random prompt, a summary line, the self-checks and SEQ_MATCH
    with ``--check``. The exit code: 1 when a checked run failed its verdict (:attr:`CheckedRun.passed`)."""
    out = checked.to_json()
    if args.json:
        print_json(out)
    else:
        if stream is not None and stream.streamed:
            print()  # end the streamed text's line
        elif out.get("text") is not None:
            print(out["text"])
        else:
            print(f"tokens: {out.get('tokens')}")
        print(summary_line(out))
        for check in checked.checks:
            print(f"[self-check] {check.name}: {check.status}, {check.detail}")
        if args.check:
            print(f"SEQ_MATCH {checked.seq_match}")
    warning = context_warning(out, getattr(args, "max_new_tokens", None))
    if warning:
        print(warning, file=sys.stderr)
    for check in checked.failures:
        print(f"error: self-check {check.name} failed: {check.detail}\n  fix: {check.fix}", file=sys.stderr)
    return 0 if (not args.check or checked.passed) else 1


def add_prompt_options(p: argparse.ArgumentParser, default_tokens: int) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prompt-len", type=int, default=24, help="random prompt of N tokens (BOS first)")
    group.add_argument("--prompt", default=None, help="prompt text (needs tokenizer.json next to the model)")
    group.add_argument("--chat", default=None, metavar="MESSAGE",
                       help="one user message through the model's chat template (chat_template.jinja or "
                            "tokenizer_config.json; else its family's format), for instruct models")
    p.add_argument("--max-new-tokens", type=int, default=default_tokens,
                   help="new tokens at most (fewer at an end-of-sequence or the end of the context, which is said)")


def add_dtype_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help=f"dtype {what}; the host softcap and sampling stay float32")


def add_speculation_options(p: argparse.ArgumentParser, where: str) -> None:
    """``--speculate``, ``--draft`` and ``--draft-tokens``; ``where`` says what runs the verify steps."""
    p.add_argument("--speculate", choices=["ngram", "assistant"], default=None,
                   help="speculative decoding: ngram drafts by prompt lookup (the continuation of an earlier occurrence "
                        "of the text's last tokens), assistant by a Gemma-4 drafter (--draft) reading the port's own "
                        f"KV store; every draft checked by one verify step of the target; greedy output is unchanged "
                        f"({where})")
    p.add_argument("--draft", default=None, metavar="DIR",
                   help="--speculate assistant: the drafter's directory (gemma4_assistant for E2B/E4B, "
                        "gemma4_unified_assistant for the 12B, as transformers saves it); with --tiny and no --draft, a "
                        "tiny drafter with random weights")
    p.add_argument("--draft-tokens", type=int, default=4, metavar="K",
                   help="--speculate: drafted tokens checked per verify step at most (default 4)")


def speculation_report(method: str, draft_tokens: int, result: Any, drafter: str | None = None) -> dict[str, Any]:
    """What speculation did in a run (``result``: a GenerationResult): drafted and kept tokens, the acceptance rate,
    verify steps and tokens per target step."""
    made = sum(len(t) for t in result.tokens) - len(result.tokens)  # after each row's first (the prefill's)
    steps = result.decode_steps
    return {"method": method, "drafter": drafter, "draft_tokens": draft_tokens, "drafted": result.drafted,
            "accepted": result.accepted,
            "acceptance_rate": round(result.accepted / result.drafted, 4) if result.drafted else None,
            "verify_steps": steps, "tokens_per_step": round(made / steps, 4) if steps else None}


__all__ = ["print_json", "add_speculation_options", "speculation_report", "int_list", "rate_list", "prompt_from_args",
           "emit_generation",
           "add_prompt_options", "add_dtype_option"]
