"""The neuron-port command's parser: every subcommand the README lists, registered by its group's
module, each routed to a handler; and the shared argument types."""

import argparse
import re

import pytest

from neuron_port.cli.command import build_parser
from neuron_port.cli.commands import MODULES, artifacts, doctor, inspect, porting, serving
from neuron_port.cli.commands.common import int_list
from tests.helpers import ROOT

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
