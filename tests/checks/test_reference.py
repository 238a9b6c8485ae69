"""The Hugging Face reference: the text model of a multimodal checkpoint, and a checkpoint missing parameters
refused."""


from __future__ import annotations

import pytest
import torch

from neuron_port import load_config
from neuron_port.checks.loader_check import loader_mismatches
from neuron_port.checks.reference import hf_reference_model
from neuron_port.model.loading import build_model, load_model_dir
from neuron_port.model.localdir import write_model_dir


def test_the_reference_of_a_multimodal_checkpoint_is_its_text_model(tmp_path):
    """A Gemma-4 ConditionalGeneration checkpoint: transformers loads it whole, the reference is its
    text CausalLM with those tensors, and the library's loader agrees with it."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(0)
    wrapped = Gemma4ForConditionalGeneration(Gemma4Config(text_config=load_config("gemma-4-e2b", tiny=True).to_dict()))
    wrapped.save_pretrained(tmp_path)
    reference = hf_reference_model(tmp_path)
    assert type(reference).__name__ == "Gemma4ForCausalLM"
    assert loader_mismatches(load_model_dir(tmp_path), reference) == []
    ids = torch.tensor([[2, 5, 9, 11]])
    with torch.no_grad():
        torch.testing.assert_close(reference(ids).logits, wrapped.eval()(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_a_checkpoint_missing_parameters_is_refused_as_a_reference(tmp_path):
    """transformers would fill the gap with random values and only log it: the oracle refuses."""
    from safetensors.torch import load_file, save_file

    from neuron_port.errors import ConfigError

    write_model_dir(build_model(load_config("llama", tiny=True), seed=3), tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.0.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="random weights"):
        hf_reference_model(tmp_path)
