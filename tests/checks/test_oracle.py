"""Oracle comparisons: golden round trips, token and logit comparisons, and the divergence rule."""


import pytest
import torch

from neuron_port import load_config
from neuron_port.checks.oracle import (
    Golden,
    GoldenMismatchError,
    classify_divergence,
    compare_tokens,
    compare_with_golden,
    logit_metrics,
    make_golden,
)
from neuron_port.checks.selfcheck import check_logits
from neuron_port.model.loading import build_model


def test_golden_of_the_same_checkpoint_round_trips(tiny_e2b, tmp_path):
    golden = make_golden(tiny_e2b, [2, 10, 11, 12], 6)
    golden.save(tmp_path / "g")
    loaded = Golden.load(tmp_path / "g")
    result = compare_with_golden(loaded, tiny_e2b, golden.tokens, golden.logits)
    assert result["seq_match"] and result["logits"]["max_abs_error"] == 0.0
    other = build_model(load_config("gemma-4-e2b", tiny=True), seed=1)
    with pytest.raises(GoldenMismatchError, match="different contents"):
        compare_with_golden(loaded, other, golden.tokens)


def test_token_and_logit_comparisons():
    assert compare_tokens([1, 2, 3], [1, 2, 3]).match
    assert compare_tokens([1, 2, 4], [1, 2, 3]).first_divergence == 2
    assert compare_tokens([1, 2], [1, 2, 3]).first_divergence == 2
    g = torch.Generator().manual_seed(0)
    want = torch.randn(3, 50, generator=g) * 5
    same = logit_metrics(want, want)
    assert same["max_abs_error"] == 0 and same["topk_agreement"] == {"1": 1.0, "5": 1.0, "10": 1.0}
    noisy = want + 0.5 * torch.randn(3, 50, generator=g)
    # the one logit rule (the dtype's bound on the largest logit) passes what metrics call equal, fails noise
    assert check_logits(list(want + 1e-5), list(want), None)[0].status == "pass"
    assert check_logits(list(noisy), list(want), None)[0].status == "fail"


def test_divergence_rule_tells_near_ties_from_errors():
    logits = torch.tensor([1.0, 5.0, 4.995, 0.0])
    assert classify_divergence(3, 2, logits).kind == "near_tie"
    assert classify_divergence(3, 0, logits).kind == "error"
    assert classify_divergence(3, 2, torch.tensor([1.0, 5.0, 4.0, 0.0])).kind == "error"
