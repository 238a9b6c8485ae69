"""The neuron-port command's parser: every subcommand the README lists, registered by its group's
module, each routed to a handler; and the shared argument types."""

import argparse
import json
import re

import pytest

from neuron_port.cli.command import build_parser
from neuron_port.cli.commands import MODULES, artifacts, doctor, inspect, porting, serving
from neuron_port.cli.commands.common import int_list
from neuron_port.cli.help_format import DefaultsShown
from tests.helpers import ROOT, run_cli

GROUPS = {"describe": inspect, "shard-plan": inspect, "plan": inspect, "lint": inspect, "port": porting,
          "compile": artifacts, "generate": artifacts, "doctor": doctor, "serve": serving}


def test_every_subcommand_the_readme_lists_has_its_groups_handler():
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^neuron-port ([a-z-]+) ", readme, flags=re.M))
    assert listed == set(GROUPS) and set(GROUPS.values()) == set(MODULES)
    parser = build_parser()
    choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(choices) == set(GROUPS)
    for name, module in GROUPS.items():
        handler = choices[name].get_default("func")
        assert handler.__module__ == module.__name__, (name, handler)


def test_int_lists_take_positive_integers_only():
    assert int_list("32, 64,128") == [32, 64, 128]
    for bad, words in (("32,x", "comma-separated integers"), ("0,8", "positive integers"), ("", "positive integers")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            int_list(bad)


def test_a_run_cut_by_the_context_says_so_in_one_warning_line():
    cut = run_cli("port", "gemma-4-e2b", "--tiny", "--buckets", "16", "--kv-len", "32", "--prompt-len", "8",
                  "--max-new-tokens", "40", "--json")
    assert cut.returncode == 0, cut.stderr
    out = json.loads(cut.stdout)
    assert out["finish_reason"] == "length" and out["new_tokens"] < 40
    warnings = [line for line in cut.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: stopped at the end of the context after {out['new_tokens']} of the 40 new tokens "
                        "asked for (prompt 8 tokens); build with a longer KV length (--kv-len, --kv-lens) for more"]
    whole = run_cli("port", "gemma-4-e2b", "--tiny", "--buckets", "16", "--kv-len", "32", "--prompt-len", "8",
                    "--max-new-tokens", "4", "--json")
    assert whole.returncode == 0 and "warning:" not in whole.stderr


def test_compile_says_the_prompt_and_context_lengths_it_chose(tmp_path):
    res = run_cli("compile", "gemma-4-e2b", "--tiny", "--buckets", "8,16", "--kv-lens", "32,64", "--out", str(tmp_path / "A"))
    assert res.returncode == 0, res.stderr
    assert "prompts up to 16 tokens (buckets [8, 16], --buckets), context 64 tokens (KV lengths [32, 64], --kv-lens)" \
        in res.stdout


def test_every_option_has_help_and_shows_its_default():
    """``neuron-port CMD --help`` explains every argument, and an option with a default says what it is."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, command in commands.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}: no help"
        shown = DefaultsShown(name)
        for action in command._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in shown._get_help_string(action), (name, action.option_strings)
    compile_help = " ".join(commands["compile"].format_help().split())
    assert "(default: 32,64,128)" in compile_help and "(default: 256)" in compile_help


def test_serve_leaves_one_core_to_the_http_side_and_refuses_zero_threads(capsys):
    from neuron_port.cli.commands.serving import default_threads

    assert [default_threads(n) for n in (1, 2, 4, 16)] == [1, 1, 3, 15]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "gemma-4-e2b", "--threads", "0"])
    assert "expected at least 1 thread, found 0" in capsys.readouterr().err
