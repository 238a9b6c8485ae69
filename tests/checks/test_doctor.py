"""The doctor's triage, cheapest check first: tokenizer, buffers, weights, a golden made from a stripped
checkpoint."""


import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models

from neuron_port.checks.doctor import report, run_doctor, tokenizer_problems
from neuron_port.checks.oracle import (
    GoldenMismatchError,
    compare_with_golden,
    make_golden,
)
from neuron_port.families import family_for
from neuron_port.model.loading import read_checkpoint
from neuron_port.model.localdir import write_tokenizer
from tests.helpers import run_cli


@pytest.fixture()
def good_dir(tiny_e2b, tmp_path):
    """A tiny E2B directory as Hugging Face writes it (save_pretrained) plus a local tokenizer."""
    d = tmp_path / "good"
    tiny_e2b.save_pretrained(str(d))
    write_tokenizer(d, tiny_e2b.config.vocab_size)
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


def test_golden_from_a_ple_stripped_checkpoint_is_refused(tiny_e2b, good_dir):
    from transformers import Gemma4ForCausalLM

    _rewrite_weights(good_dir, lambda s: s.pop("model.embed_tokens_per_layer.weight"))
    # what an automated port's oracle does: load what is there, the missing table re-initialised
    stripped = Gemma4ForCausalLM.from_pretrained(str(good_dir)).eval()
    golden = make_golden(stripped, [2, 10, 11, 12], 6, checkpoint=read_checkpoint(good_dir, family_for("gemma4_text")))
    port_tokens = golden.tokens  # a port that agrees with the wrong golden...
    with pytest.raises(GoldenMismatchError, match="embed_tokens_per_layer"):
        compare_with_golden(golden, tiny_e2b, port_tokens)  # ...is never reported as a pass


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
