"""Helpers every command shares: JSON output, integer lists, prompts from arguments, generation reports."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from neuron_port.errors import ConfigError
from neuron_port.model.quant import scheme_from_flags


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def int_list(text: str) -> list[int]:
    """argparse type: ``"32,64,128"`` -> [32, 64, 128] (positive integers)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, found {text!r}")
    return values


def prompt_from_args(args: argparse.Namespace, source: str, vocab: int, bos: int | None) -> list[int]:
    """``--chat MESSAGE`` through ``source``'s chat format, ``--prompt TEXT`` tokenised with its
    tokenizer.json (special tokens as the tokenizer adds them), or ``--prompt-len`` seeded random
    ids with ``bos`` first."""
    from neuron_port.errors import PromptError
    from neuron_port.generation.prompts import random_prompt, text_prompt

    if getattr(args, "chat", None) is not None:
        from neuron_port.generation.chat import chat_format_of

        fmt, tok = chat_format_of(source) if Path(source).exists() else (None, None)
        if tok is None:
            raise PromptError(f"--chat needs a tokenizer.json in {source}; it has none")
        return fmt.encode([{"role": "user", "content": args.chat}], tok, bos)
    if args.prompt is not None:
        return text_prompt(source, args.prompt)
    return random_prompt(vocab, args.prompt_len, args.seed, bos)


def emit_generation(out: dict[str, Any], args: argparse.Namespace) -> int:
    """Print a generation result (JSON or key: value lines, plus SEQ_MATCH with --check); the exit code."""
    if args.json:
        print_json(out)
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
        if args.check:
            print(f"SEQ_MATCH {out['seq_match']}")
    for check in out.get("self_checks", []):
        if check["status"] == "fail":
            print(f"error: self-check {check['name']} failed: {check['detail']}\n  fix: {check['fix']}", file=sys.stderr)
    from neuron_port.checks.selfcheck import checked_run_passed

    return 0 if (not args.check or checked_run_passed(out)) else 1


def add_prompt_options(p: argparse.ArgumentParser, default_tokens: int) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prompt-len", type=int, default=24, help="random prompt of N tokens (BOS first)")
    group.add_argument("--prompt", default=None, help="prompt text (needs tokenizer.json next to the model)")
    group.add_argument("--chat", default=None, metavar="MESSAGE",
                       help="one user message through the model's chat template (chat_template.jinja or "
                            "tokenizer_config.json; else its family's format), for instruct models")
    p.add_argument("--max-new-tokens", type=int, default=default_tokens)


def add_dtype_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help=f"dtype {what}; the host softcap and sampling stay float32 (default fp32)")


def add_quant_option(p: argparse.ArgumentParser, default: str | None = "none", what: str | None = None) -> None:
    """``--quant`` and ``--quant-head``; the parser folds the two into one scheme (:func:`fold_quant_flags`)."""
    p.add_argument("--quant", default=default, choices=["none", "int8"],
                   help=what or "weights of the device projections: none (the graph dtype) or int8 (weight-only, "
                   "symmetric per output channel, fp32 scales; the LM head stays in the graph dtype unless "
                   "--quant-head, the host tables always)")
    p.add_argument("--quant-head", action="store_true",
                   help="with --quant int8: the LM head in int8 too (untied from the word table, which the host keeps "
                        "float); the scheme reads int8+head")


def fold_quant_flags(args: argparse.Namespace) -> argparse.Namespace:
    """``args.quant`` becomes the scheme both flags name (``--quant int8 --quant-head``: ``int8+head``),
    so the commands carry one value; ``--quant-head`` without ``--quant int8`` is a ConfigError."""
    if getattr(args, "quant_head", False) and args.quant != "int8+head":
        if args.quant is None:
            raise ConfigError("--quant-head stores the LM head in int8 beside the projections: give it with --quant int8")
        args.quant = scheme_from_flags(args.quant, True)
    return args


class QuantFlagsParser(argparse.ArgumentParser):
    """An argument parser that folds ``--quant`` and ``--quant-head`` into one scheme as it parses
    (its subparsers are of this class too); a bad pair is an argparse usage error."""

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001 - argparse's own signature
        parsed, rest = super().parse_known_args(args, namespace)
        try:
            fold_quant_flags(parsed)
        except ConfigError as exc:
            self.error(str(exc))
        return parsed, rest


__all__ = ["print_json", "int_list", "prompt_from_args", "emit_generation", "add_prompt_options", "add_dtype_option",
           "add_quant_option", "fold_quant_flags", "QuantFlagsParser"]
