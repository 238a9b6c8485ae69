"""DecoderFamily is three parts, each answering one kind of question: every method is defined in exactly one
of them, none on the class itself, so a family adapter finds what it overrides by the question's kind."""

import inspect

from neuron_port.families import family_for
from neuron_port.families.config_facts import ConfigFacts
from neuron_port.families.decoder import DecoderFamily
from neuron_port.families.model_files import ModelFiles
from neuron_port.families.model_modules import ModelModules

PARTS = (ConfigFacts, ModelModules, ModelFiles)


def _methods(cls) -> set[str]:
    return {name for name, value in vars(cls).items() if inspect.isfunction(value) or isinstance(value, staticmethod)}


def test_every_method_lives_in_exactly_one_part():
    assert DecoderFamily.__mro__[1:4] == PARTS
    assert _methods(DecoderFamily) == set()
    owned = [_methods(part) for part in PARTS]
    assert all(owned) and sum(map(len, owned)) == len(set().union(*owned))  # no method in two parts
    public = {name for name in dir(DecoderFamily) if not name.startswith("__") and callable(getattr(DecoderFamily, name))}
    assert public == set().union(*owned)


def test_each_part_answers_its_own_kind_of_question(tiny_e2b):
    family = family_for("gemma4_text")
    config = family.text_config_of(tiny_e2b)
    assert isinstance(family, PARTS) and family.num_layers(config) == len(family.decoder_layers(tiny_e2b))
    assert set(family.attention_projections(family.attention(family.decoder_layers(tiny_e2b)[0]))) >= {"q", "o"}
    assert family.projection_key(0, "q").endswith("q_proj.weight")
