"""The ``neuron-port`` command.

Each subcommand (in :mod:`neuron_port.cli.commands`) is a thin adapter: it parses arguments, calls
the library, and prints a readable report or JSON. Library errors are reported as one
``error:`` line and a non-zero exit, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from neuron_port import __version__
from neuron_port.cli.commands import MODULES
from neuron_port.cli.quant_flags import QuantFlagsParser
from neuron_port.errors import NeuronPortError


def build_parser() -> argparse.ArgumentParser:
    parser = QuantFlagsParser(prog="neuron-port", description="Port Hugging Face decoders to AWS Inferentia2.")
    parser.add_argument("--version", action="version", version=f"neuron-port {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in MODULES:
        module.add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "model", None) is not None:
            from neuron_port.cli.commands.common import resolve_model_argument

            resolve_model_argument(args)
        return int(args.func(args) or 0)
    except (NeuronPortError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
