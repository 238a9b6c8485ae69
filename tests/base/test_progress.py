"""Progress bars show on a terminal only, never when quiet (which child processes inherit), never for one step."""

from __future__ import annotations

import io
import sys

from neuron_port import progress as bars


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_shows_on_a_terminal_and_not_in_a_pipe(monkeypatch):
    monkeypatch.delenv(bars.QUIET_ENV, raising=False)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert not bars.progress(range(3), desc="x").disable
    assert bars.progress(range(1), desc="x").disable  # one step: nothing to show
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert bars.progress(range(3), desc="x").disable


def test_quiet_turns_every_bar_off_and_children_inherit_it(monkeypatch):
    monkeypatch.delenv(bars.QUIET_ENV, raising=False)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    bars.set_quiet()
    try:
        import os

        assert os.environ[bars.QUIET_ENV] == "1" and bars.quiet()
        assert bars.progress(range(3), desc="x").disable
        assert bars.progress(total=5, desc="x").disable
    finally:
        bars.set_quiet(False)
    assert not bars.quiet() and not bars.progress(total=5, desc="x").disable


def test_the_command_takes_quiet(monkeypatch):
    from neuron_port.cli.command import build_parser

    monkeypatch.delenv(bars.QUIET_ENV, raising=False)
    assert build_parser().parse_args(["--quiet", "describe", "gemma-4-e2b"]).quiet
