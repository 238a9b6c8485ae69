"""The ``--quant`` and ``--quant-head`` options of every command and recipe, folded into one scheme.

``--quant int8 --quant-head`` is the scheme ``int8+head`` (:data:`neuron_port.model.quant.QUANT_SCHEMES`):
a parser of :class:`QuantFlagsParser` folds the two flags as it parses, so a command carries one value
from then on; ``--quant-head`` without ``--quant int8`` is an argparse usage error.
"""

from __future__ import annotations

import argparse

from neuron_port.errors import ConfigError
from neuron_port.model.quant import scheme_from_flags


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


__all__ = ["add_quant_option", "fold_quant_flags", "QuantFlagsParser"]
