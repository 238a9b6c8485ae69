"""Each shipped adapter answers for its model types and finds the parts of Hugging Face's own model it
names: the decoder layers, the text config, the LM head."""

import pytest
import torch

from neuron_port.families import family_for
from neuron_port.families.gemma3 import Gemma3Family
from neuron_port.families.gemma4 import Gemma4Family
from neuron_port.families.llama import LlamaFamily
from neuron_port.families.mistral import MistralFamily
from neuron_port.families.phi3 import Phi3Family
from neuron_port.families.qwen2 import Qwen2Family
from neuron_port.families.qwen3 import Qwen3Family
from neuron_port.model.configs import load_config
from neuron_port.model.loading import build_model

SHIPPED = [(Gemma4Family, "gemma-4-e2b"), (Gemma3Family, "gemma-3"), (LlamaFamily, "llama"), (MistralFamily, "mistral"),
           (Phi3Family, "phi-3"), (Qwen2Family, "qwen2"), (Qwen3Family, "qwen3")]


@pytest.mark.parametrize("adapter,name", SHIPPED)
def test_the_adapter_answers_for_its_types_and_finds_the_models_parts(adapter, name):
    config = load_config(name, tiny=True)
    family = family_for(config.model_type)
    assert type(family) is adapter and config.model_type in family.model_types
    model = build_model(config, seed=0)
    text = family.text_config_of(model)
    layers = family.decoder_layers(model)
    assert len(layers) == text.num_hidden_layers and len({id(layer) for layer in layers}) == len(layers)
    head = family.lm_head_weight(model)
    assert head.shape == (text.vocab_size, text.hidden_size)
    assert torch.equal(head, model.get_output_embeddings().weight)  # the weight the model's own logits use


def test_an_unknown_type_is_refused_naming_what_is_supported():
    with pytest.raises(ValueError, match=r"unsupported architecture bloom; supported: .*gemma3_text.*llama"):
        family_for("bloom")
