"""Gemma-4 drafters' facts: which target layers a drafter reads, and the drafters that cannot read a target."""

from __future__ import annotations

import pytest

from neuron_port.errors import DrafterError
from neuron_port.families import family_for
from neuron_port.families.gemma4_drafter import check_drafter, drafter_classes, producer_layers, tiny_drafter_config
from neuron_port.model.configs import load_config


@pytest.mark.parametrize("name", ["gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"])
def test_the_producers_are_the_last_unshared_layer_of_each_type(name):
    config = load_config(name, tiny=True)
    family = family_for(config.model_type)
    producers = producer_layers(config)
    assert set(producers) == {"sliding_attention", "full_attention"}
    for kind, layer in producers.items():
        unshared = [i for i, t in enumerate(config.layer_types) if t == kind and not family.is_kv_shared(config, i)]
        assert layer == unshared[-1]  # an owner of the port's store, the one shared layers of its type read


def test_a_drafter_that_does_not_fit_is_refused():
    config = load_config("gemma-4-e2b", tiny=True)
    text = family_for(config.model_type).config_to_dict(config)
    good = tiny_drafter_config(config, text)
    check_drafter(config, good)
    wide = tiny_drafter_config(config, text)
    wide.backbone_hidden_size = config.hidden_size * 2
    with pytest.raises(DrafterError, match="backbone"):
        check_drafter(config, wide)
    other = tiny_drafter_config(config, text)
    other.get_text_config().vocab_size = config.vocab_size + 1
    with pytest.raises(DrafterError, match="vocabulary"):
        check_drafter(config, other)
    with pytest.raises(DrafterError, match="gemma4_unified_assistant"):
        check_drafter(load_config("gemma-4-12b", tiny=True), good)
    with pytest.raises(DrafterError, match="found model_type 'llama'"):
        drafter_classes("llama")
    with pytest.raises(DrafterError, match="llama model has no Gemma-4 drafter"):
        tiny_drafter_config(load_config("llama", tiny=True), {})


@pytest.mark.parametrize("field,said", [("sliding_window", "sliding window"), ("global_head_dim", "full_attention")])
def test_a_drafter_with_another_window_or_kv_shape_is_refused(field, said):
    config = load_config("gemma-4-e2b", tiny=True)
    text = family_for(config.model_type).config_to_dict(config)
    text[field] = 2 * text[field]
    with pytest.raises(DrafterError, match=said):
        check_drafter(config, tiny_drafter_config(config, text))
