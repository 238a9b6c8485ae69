"""Adapters from other distributions: an entry point naming a DecoderFamily (class or instance) is
found with its distribution and version; a broken one is a warning naming it, never an error."""

import warnings
from types import SimpleNamespace

import pytest

from neuron_port.families import family_for, plugins
from neuron_port.families.decoder import DecoderFamily
from neuron_port.families.plugins import GROUP, AdapterSource, class_path, discover, shipped_source


class _Helium(DecoderFamily):
    name = "helium"
    model_types = ("helium",)


class _Entry:
    def __init__(self, name, target, dist="helium-port", version="0.3"):
        self.name, self.value, self._target = name, f"helium_port:{name}", target
        self.dist = SimpleNamespace(name=dist, version=version)

    def load(self):
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def test_discover_finds_classes_and_instances_and_warns_on_broken_ones(monkeypatch):
    entries = [_Entry("b_instance", _Helium()), _Entry("a_class", _Helium), _Entry("c_broken", ImportError("no torch")),
               _Entry("d_not_a_family", object)]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: entries if group == GROUP else [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = list(discover())
    assert [source.entry_point for _, source in found] == ["a_class", "b_instance"]  # sorted, the bad ones skipped
    family, source = found[0]
    assert isinstance(family, _Helium) and source.requirement() == "helium-port==0.3"
    assert source.adapter_class == class_path(family) and source.adapter_class.endswith(":_Helium")
    messages = [str(w.message) for w in caught]
    assert any("'c_broken'" in m and "ImportError: no torch" in m for m in messages)
    assert any("'d_not_a_family'" in m and "expected a DecoderFamily" in m for m in messages)


def test_a_shipped_adapter_names_this_package():
    source = shipped_source(family_for("gemma4_text"))
    assert isinstance(source, AdapterSource) and source.distribution == "neuron-port"
    assert source.to_json()["name"] == family_for("gemma4_text").name
    assert AdapterSource("x", "m:C", "dist", None).requirement() == "dist"


def test_an_adapter_without_model_types_is_refused():
    class Nameless(DecoderFamily):
        name = "nameless"
        model_types = ()

    with pytest.raises(TypeError, match="declares no model_types"):
        plugins._as_family(Nameless)
