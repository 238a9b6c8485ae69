"""The few-lines API (``neuron_port.from_pretrained``): text in, text out, against transformers' own
``from_pretrained`` and greedy ``generate`` on the real SmolLM2 checkpoint, from the model and from its artifact."""

from __future__ import annotations

import pytest
import torch

import neuron_port
from neuron_port.auto import PortedModel
from neuron_port.errors import ModelSourceError, PromptError

PROMPT = "The capital of France is"


def _hf_greedy(directory, ids: list[int], new_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.slow
def test_text_in_text_out_as_transformers_generates_it_then_from_the_artifact(smollm2_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = neuron_port.from_pretrained(smollm2_dir, buckets=(16, 64), kv_len=96)
    assert model.generate_ids(PROMPT, max_new_tokens=8) == _hf_greedy(smollm2_dir, tokenizer(PROMPT).input_ids, 8)
    text = model.generate(PROMPT, max_new_tokens=8)
    assert text.startswith(" Paris")

    question = [{"role": "user", "content": "What is the capital of France?"}]
    chat_ids = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = _hf_greedy(smollm2_dir, list(chat_ids), 8)
    assert model.generate_ids("What is the capital of France?", max_new_tokens=8, chat=True) == expected[:8]
    from neuron_port.model import configs

    reads, load_config = [], configs.load_config
    monkeypatch.setattr(configs, "load_config", lambda *a, **k: reads.append(a) or load_config(*a, **k))
    assert model.generate(PROMPT, max_new_tokens=8) == text and reads == []  # its special ids were read once, and kept

    artifact = model.compile(tmp_path / "artifact")
    reloaded = neuron_port.from_pretrained(artifact)
    assert isinstance(reloaded, PortedModel) and reloaded.artifact
    assert reloaded.generate(PROMPT, max_new_tokens=8) == text


def test_a_shipped_name_needs_tiny_and_random_weights_take_ids():
    with pytest.raises(ModelSourceError, match="is a config, not weights"):
        neuron_port.from_pretrained("gemma-4-e2b")
    tiny = neuron_port.from_pretrained("gemma-4-e2b", tiny=True, buckets=(16,), kv_len=32)
    assert len(tiny.generate_ids([2, 10, 11], max_new_tokens=3)) == 3
    with pytest.raises(PromptError, match="no tokenizer"):
        tiny.generate("hello")
    with pytest.raises(ModelSourceError, match="random weights has no directory"):
        tiny.compile("unused")
