"""docs/cli.md is generated from the parser: it lists every command and option, and it is the parser's own."""

from __future__ import annotations

from neuron_port.cli.command import build_parser
from neuron_port.cli.reference import _subcommands, cli_reference
from tests.helpers import ROOT


def test_the_page_is_what_the_parser_generates():
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == cli_reference(), "docs/cli.md is stale: python -m neuron_port.cli.reference > docs/cli.md"


def test_every_command_and_option_is_on_the_page():
    page = cli_reference()
    for name, (sub, _) in _subcommands(build_parser()).items():
        assert f"## `{name}`" in page
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in page, (name, option)
    assert "(default: 32,64,128)" in page and "(default: 8000)" in page
