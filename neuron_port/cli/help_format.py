"""How every ``neuron-port`` command and recipe prints its ``--help``: each option's default shown."""

from __future__ import annotations

import argparse


class DefaultsShown(argparse.HelpFormatter):
    """Help lines that end with the option's default, as ``ArgumentDefaultsHelpFormatter`` does, except where the
    help already speaks of its default, or there is none to show (None, False: a flag that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        shown = ",".join(str(v) for v in default) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


__all__ = ["DefaultsShown"]
