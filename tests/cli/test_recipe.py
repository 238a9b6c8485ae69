"""The helpers every recipe shares: the standard options and their defaults, where an artifact goes,
and a recipe's exit code following its checked run."""

import argparse

import pytest

from neuron_port.cli import recipe


def test_the_standard_options_and_their_defaults():
    args = recipe.recipe_parser("x", tp=2).parse_args([])
    assert (args.backend, args.tp, args.target, args.dtype, args.prompt_len, args.max_new_tokens) == (
        "cpu", 2, "inf2.xlarge", "fp32", 24, 32)
    assert not args.serve and args.model_dir is None and args.out is None
    assert recipe.recipe_parser("x").parse_args([]).tp is None  # the planner decides
    with pytest.raises(SystemExit):
        recipe.recipe_parser("x").parse_args(["--backend", "tpu"])


def test_the_artifact_goes_under_out_or_a_fresh_temporary_directory(tmp_path):
    assert recipe.artifact_dir(argparse.Namespace(out=str(tmp_path)), "p-") == tmp_path / "artifact"
    first = recipe.artifact_dir(argparse.Namespace(out=None), "p-")
    second = recipe.artifact_dir(argparse.Namespace(out=None), "p-")
    assert first.name == "artifact" and first.parent.name.startswith("p-") and first != second


def test_a_recipe_fails_when_its_checked_run_does(monkeypatch, capsys):
    from neuron_port.checks.check import Check
    from neuron_port.checks.checked_run import CheckedRun, Divergence, TokenMatch

    run = CheckedRun(run={"artifact": "a", "backend": "cpu", "tp": 1, "new_tokens": 8, "decode_tok_per_s": 1.0},
                     checks=[Check("logits", "pass", "max 1e-6")], match=TokenMatch([1, 2], None))
    monkeypatch.setattr("neuron_port.checks.validation.check_in_fresh_process", lambda *a: run)
    args = argparse.Namespace(prompt_len=24, max_new_tokens=8, serve=False)
    assert recipe.validate_then_serve("a", args) == 0
    assert "SEQ_MATCH True" in capsys.readouterr().out
    run.match = TokenMatch([1, 2], Divergence(1, "error", 3, 2, 0.5))
    assert recipe.validate_then_serve("a", args) == 1
    run.match, run.checks = TokenMatch([1, 2], None), [Check("logits", "fail", "step 0 off")]
    assert recipe.validate_then_serve("a", args) == 1


def test_a_recipe_reports_a_library_error_in_one_line(capsys):
    from neuron_port.errors import ConfigError

    def failing() -> int:
        raise ConfigError("no config found for 'x'")

    assert recipe.run_recipe(failing) == 2
    assert capsys.readouterr().err == "error: no config found for 'x'\n"
    assert recipe.run_recipe(lambda: 0) == 0 and recipe.run_recipe(lambda: None) == 0


def test_a_recipes_help_shows_the_degree_it_runs_at():
    assert "tensor-parallel degree (default: 2)" in " ".join(recipe.recipe_parser("d", tp=2).format_help().split())
    assert "(default: the planner's recommendation)" in " ".join(recipe.recipe_parser("d").format_help().split())
