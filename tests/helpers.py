"""Shared test helpers."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run ``neuron-port ARGS`` in this process (fast), capturing its output."""
    from neuron_port.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
    return CliResult(code, out.getvalue(), err.getvalue())


def run_cli_process(*args: str, timeout: float = 600) -> CliResult:
    """Run ``neuron-port ARGS`` as a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_port", *args], capture_output=True, text=True, timeout=timeout
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)
