"""The CLI reference page (``docs/cli.md``), generated from the parser itself so it cannot drift from ``--help``.

``python -m neuron_port.cli.reference > docs/cli.md`` writes it; a test fails when the page and the parser
disagree.
"""

from __future__ import annotations

import argparse

from neuron_port.cli.command import build_parser
from neuron_port.cli.help_format import DefaultsShown

HEADER = """# CLI reference

Every `neuron-port` command and option, generated from the parser (`python -m neuron_port.cli.reference >
docs/cli.md`; a test fails when this page and `--help` disagree). `MODEL` is a Hugging Face id, a local model
directory, a `config.json` or a shipped name (see [Getting started](getting-started.md)).

```python
from neuron_port.cli.reference import cli_reference

print(cli_reference().splitlines()[0])  # this page, from the parser
```
"""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return {name: (sub, helps.get(name) or "") for name, sub in action.choices.items()}


def _option_row(action: argparse.Action, shown: DefaultsShown) -> str:
    names = ", ".join(f"`{n}`" for n in action.option_strings) or f"`{action.dest}`"
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        names += " {" + ",".join(str(c) for c in action.choices) + "}"
    text = shown._get_help_string(action) % {"default": action.default, "prog": "neuron-port"}
    return f"| {names} | {' '.join(text.split()).replace('|', '/')} |"


def cli_reference() -> str:
    """``docs/cli.md``: each command's purpose, usage and every argument with its help and default."""
    parser = build_parser()
    lines = [HEADER]
    for name, (sub, purpose) in _subcommands(parser).items():
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        lines += [f"## `{name}`", "", f"{purpose[:1].upper()}{purpose[1:]}.", "", "```", usage, "```", "",
                  "| argument | what it does |", "|---|---|"]
        shown = DefaultsShown(name)
        lines += [_option_row(a, shown) for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        lines.append("")
    return "\n".join(lines)


__all__ = ["HEADER", "cli_reference"]


if __name__ == "__main__":
    print(cli_reference(), end="")
