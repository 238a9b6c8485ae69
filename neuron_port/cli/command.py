"""The ``neuron-port`` command.

Each subcommand (in :mod:`neuron_port.cli.commands`) is a thin adapter: it parses arguments, calls
the library, and prints a readable report or JSON. Library errors are reported as one
``error:`` line and a non-zero exit, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from neuron_port.cli.commands import MODULES
from neuron_port.cli.help_format import DefaultsShown
from neuron_port.cli.quant_flags import QuantFlagsParser
from neuron_port.errors import NeuronPortError
from neuron_port.versions import LIBRARY_VERSION as __version__


def build_parser() -> argparse.ArgumentParser:
    parser = QuantFlagsParser(prog="neuron-port", description="Port Hugging Face decoders to AWS Inferentia2.",
                              formatter_class=DefaultsShown)
    parser.add_argument("--version", action="version", version=f"neuron-port {__version__}")
    parser.add_argument("--quiet", action="store_true", help="no progress bars (also NEURON_PORT_QUIET=1; they show "
                        "on a terminal only)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in MODULES:
        module.add(sub)
    for command in sub.choices.values():
        command.formatter_class = DefaultsShown
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quiet:
        from neuron_port.progress import set_quiet

        set_quiet()
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
