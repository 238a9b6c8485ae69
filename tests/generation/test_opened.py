"""One opened model: its config, family, special and stop ids, tokenizer and chat format, read once and the
same as reading each from the files again."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.generation import opened as opened_module
from neuron_port.generation.chat import chat_format
from neuron_port.generation.opened import OpenedModel
from neuron_port.model.configs import load_config
from neuron_port.model.loading import build_model
from neuron_port.model.localdir import write_model_dir
from neuron_port.model.tokenizer import decode_completion, load_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("opened") / "model"
    write_model_dir(build_model(load_config("llama", tiny=True), seed=0), out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    return out


def test_a_directory_opens_to_its_config_family_and_files(model_dir):
    opened = OpenedModel.open(model_dir)
    assert opened.directory == model_dir and not opened.artifact and opened.real_weights
    assert opened.family.name == "llama" and opened.vocab_size == opened.config.vocab_size
    assert opened.eos_ids[-2:] == (7, 9)  # the generation config's, after the config's own
    tokenizer = load_tokenizer(model_dir)
    fmt = chat_format(opened.family, tokenizer, model_dir)
    assert opened.chat.stop_ids == fmt.stop_ids and opened.tokenizer.get_vocab() == tokenizer.get_vocab()
    tokens = opened.text_prompt("the user is")
    assert opened.decode(tokens, [tokens[-1]]) == decode_completion(model_dir, tokens, [tokens[-1]])
    assert opened.chat_prompt("hi") == fmt.encode([{"role": "user", "content": "hi"}], tokenizer, opened.special.bos)


@settings(max_examples=24, deadline=None, derandomize=True)
@given(chat=st.booleans(), eos_means_end=st.none() | st.booleans(), stop_at_eos=st.none() | st.booleans())
def test_stop_ids_are_what_the_files_give(model_dir, chat, eos_means_end, stop_at_eos):
    opened = OpenedModel.open(model_dir)
    config_eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    config_eos = config_eos if isinstance(config_eos, list) else [config_eos]
    files = [*config_eos, *json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]]
    if chat:  # the chat format's turn-ending ids, from the tokenizer's own special tokens
        files += chat_format(opened.family, load_tokenizer(model_dir), model_dir).stop_ids
    means_end = True if eos_means_end is None else eos_means_end  # a directory holds real weights
    want = list(dict.fromkeys(files)) if (means_end if stop_at_eos is None else stop_at_eos) else []
    assert opened.stop_ids(chat, eos_means_end, stop_at_eos) == want


def test_files_are_read_once(model_dir, monkeypatch):
    opened = OpenedModel.open(model_dir)
    reads = []
    monkeypatch.setattr(opened_module, "load_config", lambda *a, **k: reads.append(("config", a)))
    real_tokenizer = opened_module.load_tokenizer
    monkeypatch.setattr(opened_module, "load_tokenizer", lambda *a: reads.append(("tokenizer", a)) or real_tokenizer(*a))
    for _ in range(3):
        opened.stop_ids(chat=True)
        opened.decode(opened.text_prompt("the user is"))
        opened.chat_prompt("hi")
    assert reads == [("tokenizer", (model_dir,))]


def test_a_shipped_name_has_no_files_and_its_eos_means_nothing():
    opened = OpenedModel.open("gemma-4-e2b", tiny=True)
    assert opened.directory is None and not opened.real_weights and opened.tokenizer is None
    assert opened.stop_ids() == [] and opened.stop_ids(stop_at_eos=True) == list(opened.special.eos)
    assert opened.config.hidden_size == load_config("gemma-4-e2b", tiny=True).hidden_size
    assert opened.random_prompt(5, seed=1)[0] == opened.special.bos and opened.decode([1, 2]) is None
    with pytest.raises(Exception, match="needs a tokenizer.json"):
        opened.text_prompt("hello")


def test_an_artifact_opens_as_one(tiny_e2b_artifact):
    opened = OpenedModel.open(tiny_e2b_artifact, tiny=True)  # an artifact keeps its own config: tiny changes nothing
    assert opened.artifact and opened.config.hidden_size == load_config(tiny_e2b_artifact).hidden_size
