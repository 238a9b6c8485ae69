"""Subcommands beyond ``describe``: each registers itself with :mod:`neuron_port.cli`."""

from __future__ import annotations
