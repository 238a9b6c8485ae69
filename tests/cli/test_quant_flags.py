"""``--quant`` and ``--quant-head`` fold into one scheme as a command line is parsed."""

import argparse

import pytest

from neuron_port.cli.quant_flags import QuantFlagsParser, add_quant_option, fold_quant_flags


def _parser(default="none") -> QuantFlagsParser:
    parser = QuantFlagsParser(prog="p")
    add_quant_option(parser, default=default)
    return parser


def test_the_two_flags_are_one_scheme():
    assert _parser().parse_args([]).quant == "none"
    assert _parser().parse_args(["--quant", "int8"]).quant == "int8"
    assert _parser().parse_args(["--quant-head", "--quant", "int8"]).quant == "int8+head"  # in either order
    assert fold_quant_flags(argparse.Namespace(quant="int8+head", quant_head=True)).quant == "int8+head"  # once


@pytest.mark.parametrize("default,args,said", [("none", ["--quant-head"], "found --quant none"),
                                               (None, ["--quant-head"], "give it with --quant int8")])
def test_a_head_without_int8_projections_is_a_usage_error(default, args, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser(default).parse_args(args)
    assert exit_.value.code == 2 and said in capsys.readouterr().err
