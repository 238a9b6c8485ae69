"""An adapter whose hooks miss its model is named in one ``error:`` line, never a traceback.

Each case puts a deliberately wrong Helium adapter in the family table for one test (as
``register_family`` would, undone afterwards) and runs the command in this process.
"""


from __future__ import annotations

import json

import pytest

from neuron_port import families
from neuron_port.artifacts.manifest import _check_adapter
from neuron_port.errors import ArtifactError
from neuron_port.families import AdapterSource, DecoderFamily
from tests.helpers import run_cli


class Helium(DecoderFamily):
    name = "helium"
    text_types = model_types = ("helium",)
    config_classes = {"helium": ("transformers", "HeliumConfig")}
    causal_lm_classes = {"helium": ("transformers", "HeliumForCausalLM")}
    tiny_heads = (4, 2)

    def attention_mask_argument(self, masks):
        return masks["full"]


class WrongNames(Helium):
    _ATTN = {"q": "query", "k": "k_proj", "v": "v_proj", "o": "o_proj"}


class WrongConfigField(Helium):
    def n_q(self, config, index):
        return config.n_heads


class NoClasses(Helium):
    config_classes = {}


CASES = {"names": WrongNames, "field": WrongConfigField, "classes": NoClasses}


@pytest.fixture(scope="module")
def helium_config(tmp_path_factory):
    from transformers import HeliumConfig

    path = tmp_path_factory.mktemp("helium") / "config.json"
    config = HeliumConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    path.write_text(json.dumps({**config.to_dict(), "model_type": "helium"}))
    return path


@pytest.mark.parametrize("case,command,expected", [
    ("names", "port", "error: the helium adapter's attention_projections() gave no 'q' projection with a weight for layer 0"),
    ("names", "plan", "error: the helium adapter's attention_projections() gave no 'q' projection with a weight for layer 0"),
    ("field", "describe", "error: the helium adapter's n_q() hook failed on this model: AttributeError"),
    ("classes", "lint", "error: "),
])
def test_a_hook_that_misses_the_model_is_named(helium_config, case, command, expected, monkeypatch):
    monkeypatch.setitem(families._BY_TYPE, "helium", CASES[case]())
    args = [command, str(helium_config)] + (["--tiny", "--max-new-tokens", "2"] if command == "port" else [])
    res = run_cli(*args)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert expected in res.stderr, res.stderr[-2000:]
    if case == "classes":
        assert "names no class for model type 'helium': add it to its config_classes" in res.stderr


def test_a_plugin_of_another_version_than_the_artifacts_is_refused(monkeypatch):
    recorded = {"name": "helium", "adapter_class": "helium_port:HeliumFamily", "distribution": "helium-port",
                "version": "0.1.0", "entry_point": "helium"}
    manifest = {"model_type": "llama", "adapter": recorded}
    newer = AdapterSource("helium", "helium_port:HeliumFamily", "helium-port", "0.2.0", "helium")
    monkeypatch.setattr("neuron_port.artifacts.manifest.adapter_source", lambda family: newer)
    with pytest.raises(ArtifactError, match="this environment has helium-port==0.2.0.*--allow-version-mismatch"):
        _check_adapter(manifest, allow_mismatch=False)
    _check_adapter(manifest, allow_mismatch=True)
    same = AdapterSource("helium", "helium_port:HeliumFamily", "helium-port", "0.1.0", "helium")
    monkeypatch.setattr("neuron_port.artifacts.manifest.adapter_source", lambda family: same)
    _check_adapter(manifest, allow_mismatch=False)
