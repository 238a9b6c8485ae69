"""Oracle comparisons, golden integrity, tokenizer sanity and the doctor's triage."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models

from neuron_port import load_config
from neuron_port.checks.doctor import report, run_doctor, tokenizer_problems
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
from neuron_port.families import family_for
from neuron_port.model.loading import build_model, read_checkpoint
from neuron_port.model.localdir import write_tokenizer
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def model():
    return build_model(load_config("gemma-4-e2b", tiny=True), seed=0)


@pytest.fixture()
def good_dir(model, tmp_path):
    """A tiny E2B directory as Hugging Face writes it (save_pretrained) plus a local tokenizer."""
    d = tmp_path / "good"
    model.save_pretrained(str(d))
    write_tokenizer(d, model.config.vocab_size)
    return d


def _rewrite_weights(directory, edit):
    path = directory / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))


def _doctor(directory):
    res = run_cli("doctor", str(directory), "--json")
    return res.returncode, json.loads(res.stdout)


def test_good_directory_passes_every_check(good_dir):
    code, d = _doctor(good_dir)
    assert code == 0 and d["ok"] and d["first_failure"] is None
    assert [c["name"] for c in d["checks"]] == ["files", "tokenizer", "weights", "buffers", "artifact", "loader",
                                                "port", "embeddings", "attention", "logits"]
    assert {c["status"] for c in d["checks"]} == {"pass", "skip"}
    assert all(c["status"] == "pass" for c in d["checks"][-4:])
    text = run_cli("doctor", str(good_dir)).stdout
    assert text.startswith("OK") and "[pass] port" in text


def test_missing_tokenizer_fails_first(good_dir):
    (good_dir / "tokenizer.json").unlink()
    code, d = _doctor(good_dir)
    assert code != 0 and d["first_failure"] == "files"
    assert run_cli("doctor", str(good_dir)).stdout.startswith("FAILED: files")


def test_tokenizer_without_vocabulary_fails_the_tokenizer_step(good_dir):
    empty = Tokenizer(models.WordLevel(vocab={"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}, unk_token="<unk>"))
    empty.save(str(good_dir / "tokenizer.json"))
    code, d = _doctor(good_dir)
    assert code != 0 and d["first_failure"] == "tokenizer"
    assert "<unk>" in d["checks"][1]["detail"]
    assert run_cli("doctor", str(good_dir)).stdout.startswith("FAILED: tokenizer")


def test_empty_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("")
    assert "empty" in tokenizer_problems(tmp_path, 512)[0]


def test_checkpoint_without_layer_scalar_fails_buffers(good_dir):
    _rewrite_weights(good_dir, lambda s: [s.pop(k) for k in [k for k in s if k.endswith("layer_scalar")]])
    code, d = _doctor(good_dir)
    assert code != 0 and d["first_failure"] == "buffers" and "missing" in d["checks"][3]["detail"]


def test_checkpoint_with_reset_layer_scalar_fails_buffers(good_dir):
    def reset(state):
        for k in state:
            if k.endswith("layer_scalar"):
                state[k] = torch.ones_like(state[k])

    _rewrite_weights(good_dir, reset)
    code, d = _doctor(good_dir)
    assert code != 0 and d["first_failure"] == "buffers" and "reset" in d["checks"][3]["detail"]


def test_stripped_checkpoint_fails_weights(good_dir):
    _rewrite_weights(good_dir, lambda s: s.pop("model.embed_tokens_per_layer.weight"))
    code, d = _doctor(good_dir)
    assert code != 0 and d["first_failure"] == "weights" and "missing" in d["checks"][2]["detail"]


def test_golden_from_a_ple_stripped_checkpoint_is_refused(model, good_dir):
    from transformers import Gemma4ForCausalLM

    _rewrite_weights(good_dir, lambda s: s.pop("model.embed_tokens_per_layer.weight"))
    # what an automated port's oracle does: load what is there, the missing table re-initialised
    stripped = Gemma4ForCausalLM.from_pretrained(str(good_dir)).eval()
    golden = make_golden(stripped, [2, 10, 11, 12], 6, checkpoint=read_checkpoint(good_dir, family_for("gemma4_text")))
    port_tokens = golden.tokens  # a port that agrees with the wrong golden...
    with pytest.raises(GoldenMismatchError, match="embed_tokens_per_layer"):
        compare_with_golden(golden, model, port_tokens)  # ...is never reported as a pass


def test_golden_of_the_same_checkpoint_round_trips(model, tmp_path):
    golden = make_golden(model, [2, 10, 11, 12], 6)
    golden.save(tmp_path / "g")
    loaded = Golden.load(tmp_path / "g")
    result = compare_with_golden(loaded, model, golden.tokens, golden.logits)
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


def test_doctor_on_a_verified_artifact(tmp_path):
    out = tmp_path / "art"
    assert run_cli("compile", "gemma-4-e2b", "--tiny", "--buckets", "16", "--kv-lens", "32", "--out", str(out)).returncode == 0
    code, d = _doctor(out)
    assert code == 0, d
    assert [c["status"] for c in d["checks"] if c["name"] == "artifact"] == ["pass"]
    assert {c["name"]: c["status"] for c in d["checks"]}.items() >= {"embeddings": "pass", "logits": "pass",
                                                                    "attention": "skip"}.items()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tp"] = 2
    (out / "manifest.json").write_text(json.dumps(manifest))
    code, d = _doctor(out)
    assert code != 0 and d["first_failure"] == "artifact"
    assert report(run_doctor(out))["first_failure"] == "artifact"
