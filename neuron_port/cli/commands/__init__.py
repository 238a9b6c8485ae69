"""The subcommands of ``neuron-port``, one module per group; each module's ``add(sub)`` registers its parsers.

Commands are thin adapters: they parse arguments, call the library and print. Each imports the
library lazily inside its handler, so ``neuron-port --help`` stays fast, and none of them
imports :mod:`neuron_port.cli.command` (which imports them).
"""

from __future__ import annotations

from neuron_port.cli.commands import artifacts, doctor, inspect, porting, serving

MODULES = (inspect, porting, artifacts, doctor, serving)

__all__ = ["MODULES"]
