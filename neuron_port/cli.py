"""The ``neuron-port`` command.

Each subcommand is a thin adapter: it parses arguments, calls the library, and prints a
readable report or JSON. Library errors are reported as one ``error:`` line and a non-zero
exit, never as a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from neuron_port.errors import NeuronPortError


def _print_json(data) -> None:
    print(json.dumps(data, indent=2))


# ---- describe ------------------------------------------------------------------------------
def _cmd_describe(args: argparse.Namespace) -> int:
    from neuron_port.configs import load_config
    from neuron_port.layout import describe, format_table

    layout = describe(load_config(args.model, tiny=args.tiny))
    if args.json:
        _print_json(layout.to_json())
    else:
        print(format_table(layout))
    return 0


def _add_describe(sub) -> None:
    p = sub.add_parser("describe", help="per-layer layout of a model: attention type, heads, KV owners, params")
    p.add_argument("model", help="a shipped name (gemma-4-e2b, gemma-4-e4b, gemma-4-12b) or a local path")
    p.add_argument("--tiny", action="store_true", help="the tiny variant with the same architectural features")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_describe)


_REGISTRARS: list[Callable] = [_add_describe]


def register(fn: Callable) -> Callable:
    """Add a subcommand registrar (used by the modules below)."""
    _REGISTRARS.append(fn)
    return fn


def build_parser() -> argparse.ArgumentParser:
    from neuron_port import __version__
    from neuron_port import cli_commands  # noqa: F401  (registers the other subcommands)

    parser = argparse.ArgumentParser(prog="neuron-port", description="Port Hugging Face decoders to AWS Inferentia2.")
    parser.add_argument("--version", action="version", version=f"neuron-port {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for registrar in _REGISTRARS:
        registrar(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except NeuronPortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Delegate to the imported module so subcommands register on the same copy of this file.
    from neuron_port.cli import main as _main

    sys.exit(_main())
