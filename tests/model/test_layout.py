"""Shipped configs, tiny variants and the layout describe reads from them; bad directories refused by name."""


import json

import pytest
import torch

from neuron_port import describe, load_config
from neuron_port.errors import ConfigError, UnsupportedArchitectureError
from neuron_port.model.layout import check_model
from neuron_port.model.loading import build_model
from tests.helpers import run_cli as _cli
from tests.helpers import run_cli_json


def _describe_json(*args):
    return run_cli_json("describe", *args)


def test_describe_e2b_real():
    d = _describe_json("gemma-4-e2b")
    assert d["model_type"] == "gemma4_text"
    assert d["num_layers"] == 35 and len(d["layers"]) == 35
    assert d["kv_owners"] == list(range(15))
    for layer in d["layers"]:
        i = layer["index"]
        full = i % 5 == 4
        assert layer["attention"] == ("full" if full else "sliding")
        assert layer["head_dim"] == (512 if full else 256)
        assert layer["window"] == (None if full else 512)
        if i >= 15:
            assert layer["kv_source"] == (14 if full else 13)
        else:
            assert layer["kv_source"] == i
    assert abs(d["params"]["total"] - 4.63e9) / 4.63e9 < 0.01
    p = d["params"]
    assert p["total"] == p["embedding"] + p["per_layer_embedding"] + p["transformer"]
    assert p["per_layer_embedding"] == 262144 * 35 * 256


def test_kv_readers_count_every_layer_attending_an_owner():
    """E2B: the 20 shared layers attend layer 14 (the 4 full ones) or 13 (the 16 sliding ones)."""
    readers = describe(load_config("gemma-4-e2b")).kv_readers()
    assert readers == {**dict.fromkeys(range(13), 1), 13: 17, 14: 5}
    assert sum(readers.values()) == 35


def test_describe_e4b_real():
    d = _describe_json("gemma-4-e4b")
    assert d["num_layers"] == 42
    assert d["kv_owners"] == list(range(24))
    assert {(layer["n_q"], layer["n_kv"]) for layer in d["layers"]} == {(8, 2)}
    assert abs(d["params"]["total"] - 7.46e9) / 7.46e9 < 0.01


def test_describe_12b_real():
    d = _describe_json("gemma-4-12b")
    assert d["model_type"] == "gemma4_unified_text"
    assert d["num_layers"] == 48
    assert d["kv_owners"] == list(range(48))
    for layer in d["layers"]:
        if layer["attention"] == "sliding":
            assert (layer["n_q"], layer["n_kv"], layer["k_eq_v"]) == (16, 8, False)
        else:
            assert (layer["n_q"], layer["n_kv"], layer["k_eq_v"], layer["head_dim"]) == (16, 1, True, 512)
    assert d["params"]["per_layer_embedding"] == 0
    assert abs(d["params"]["total"] - 11.91e9) / 11.91e9 < 0.01


@pytest.mark.parametrize("name", ["gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"])
def test_tiny_keeps_structure(name):
    real = describe(load_config(name))
    tiny = _describe_json(name, "--tiny")
    period = real.layers[[s.attention for s in real.layers].index("full")].index + 1
    layers = tiny["layers"]
    # same layer-type pattern rule
    for layer in layers:
        assert (layer["attention"] == "full") == (layer["index"] % period == period - 1)
    # same head ratios per attention type, global head_dim = 2 x head_dim
    for kind in ("sliding", "full"):
        r = next(s for s in real.layers if s.attention == kind)
        t = [layer for layer in layers if layer["attention"] == kind]
        assert {(x["n_q"], x["n_kv"], x["k_eq_v"]) for x in t} == {(r.n_q, r.n_kv, r.k_eq_v)}
    sliding_hd = {x["head_dim"] for x in layers if x["attention"] == "sliding"}
    full_hd = {x["head_dim"] for x in layers if x["attention"] == "full"}
    assert len(sliding_hd) == 1 and full_hd == {2 * sliding_hd.pop()}
    # the kv_source rule: shared layers read the last owner of their own type
    owners = tiny["kv_owners"]
    shared = [x for x in layers if x["kv_source"] != x["index"]]
    if real.kv_owners != tuple(range(real.num_layers)):
        assert {x["attention"] for x in shared} == {"sliding", "full"}
        for x in shared:
            same_type = [o for o in owners if layers[o]["attention"] == x["attention"]]
            assert x["kv_source"] == max(same_type)
        assert owners == list(range(len(owners)))
    else:
        assert not shared
    # PLE presence and window small enough that short tests cross it
    assert (tiny["params"]["per_layer_embedding"] > 0) == (real.params.per_layer_embedding > 0)
    assert 8 <= tiny["sliding_window"] <= 16
    assert tiny["softcap"] == 30.0 and tiny["tied_embeddings"]


def test_double_wide_mlp_on_shared_layers_only():
    layout = describe(load_config("gemma-4-e2b", tiny=True))
    for spec in layout.layers:
        assert spec.intermediate_size == (256 if not spec.is_owner else 128)


def test_unsupported_architecture_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 8}))
    proc = _cli("describe", str(tmp_path))
    assert proc.returncode != 0
    assert "unsupported architecture mamba" in proc.stderr
    assert "gemma4_text" in proc.stderr and "llama" in proc.stderr and "qwen3" in proc.stderr
    with pytest.raises(UnsupportedArchitectureError):
        load_config(tmp_path)


def test_invalid_config_of_a_supported_family(tmp_path):
    """Hugging Face's own validation failure becomes one clear error line, not a traceback."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    proc = _cli("describe", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not a valid llama config" in proc.stderr and "hidden size (8)" in proc.stderr


def test_malformed_json_dir(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gemma4_text", ')
    proc = _cli("describe", str(tmp_path))
    assert proc.returncode != 0
    assert str(tmp_path / "config.json") in proc.stderr
    assert "malformed JSON" in proc.stderr
    with pytest.raises(ConfigError):
        load_config(tmp_path)


def test_multimodal_wrapper_config(tmp_path):
    from neuron_port.model.configs import load_config_dict

    text = load_config_dict("gemma-4-e2b")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text}))
    d = _describe_json(str(tmp_path))
    assert d["num_layers"] == 35 and d["kv_owners"] == list(range(15))


def test_model_check_finds_disagreement():
    model = build_model(load_config("gemma-4-12b", tiny=True), seed=0)
    assert describe(model).disagreements == ()
    # a k_eq_v layer that grew a v_proj, and an owner that lost its k_proj
    attn5 = model.model.layers[5].self_attn
    attn5.v_proj = torch.nn.Linear(64, attn5.k_proj.out_features, bias=False)
    del model.model.layers[0].self_attn.k_proj
    problems = check_model(describe(load_config("gemma-4-12b", tiny=True)), model)
    assert any("layer 5" in p and "V projection" in p for p in problems)
    assert any("layer 0" in p and "K projection" in p for p in problems)


def test_model_check_reads_wrapped_models():
    """The adapter reaches the text stack through the ConditionalGeneration wrapper too."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    text = load_config("gemma-4-e2b", tiny=True)
    with torch.device("meta"):
        wrapped = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text.to_dict()))
    layout = describe(wrapped)
    assert layout.kv_owners == (0, 1, 2, 3, 4, 5)
    assert layout.disagreements == ()
