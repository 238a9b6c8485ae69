"""The library's loader against transformers' own ``from_pretrained``, for every shipped family.

The oracle (neuron_port.checks.reference) is transformers' loading; the loader (models.load_model_dir:
meta device, then the checkpoint) must give the same model, every parameter and every buffer,
persistent or not. The negative tests show the check names what a broken loader leaves behind.
"""

from __future__ import annotations

import pytest
import torch

from neuron_port import load_config
from neuron_port.checks.loader_check import loader_mismatches, loader_verdict
from neuron_port.checks.reference import hf_reference_model
from neuron_port.model.configs import SHIPPED
from neuron_port.model.loading import build_model, load_model_dir, nonpersistent_buffer_owners
from neuron_port.model.localdir import write_model_dir


@pytest.mark.parametrize("name", SHIPPED)
def test_the_loader_gives_from_pretrained_s_model_for_every_family(name, tmp_path):
    write_model_dir(build_model(load_config(name, tiny=True), seed=3), tmp_path)
    reference = hf_reference_model(tmp_path)
    assert loader_mismatches(load_model_dir(tmp_path), reference) == []
    # and in bf16: exactly the cast of transformers' float32 tensors, and transformers' own bf16 model,
    # dtypes included (float32 RoPE tables stay float32, as from_pretrained(dtype=bf16) keeps them)
    bf16 = load_model_dir(tmp_path, dtype=torch.bfloat16)
    assert loader_mismatches(bf16, reference) == []
    assert loader_mismatches(bf16, hf_reference_model(tmp_path, dtype=torch.bfloat16), cast=False) == []
    assert loader_mismatches(bf16.to(torch.bfloat16), reference, cast=False)  # casting every buffer is not the same


def _old_loader(directory):
    """The loader as it was: built on the meta device, ``to_empty``-ed, the checkpoint copied in,
    the RoPE module rebuilt: every other non-persistent buffer is left as uninitialised memory."""
    from neuron_port.families import family_for
    from neuron_port.model.loading import read_checkpoint

    config = load_config(directory)
    family = family_for(config.model_type)
    with torch.device("meta"):
        model = family.causal_lm_class(config.model_type)(config)
    model = model.to_empty(device="cpu")
    for owner in nonpersistent_buffer_owners(model).values():  # make "uninitialised" deterministic
        for _, buf in owner.named_buffers(recurse=False):
            buf.fill_(2.1e-25)
    model.load_state_dict(read_checkpoint(directory, family), strict=False)
    model.tie_weights()
    family.text_model(model).rotary_emb = type(family.text_model(model).rotary_emb)(config)
    return model.eval()


def test_the_check_names_the_buffer_the_old_loader_left_uninitialised(tmp_path):
    write_model_dir(build_model(load_config("gemma-3", tiny=True), seed=3), tmp_path)
    found = loader_mismatches(_old_loader(tmp_path), hf_reference_model(tmp_path))
    assert [(m.kind, m.name, m.problem) for m in found] == [("buffer", "model.embed_tokens.embed_scale", "values")]
    scale = 64 ** 0.5  # sqrt(hidden) of the tiny variant
    assert str(found[0]) == f"buffer model.embed_tokens.embed_scale: 2.1e-25 here, {scale:.4g} in transformers"
    assert "1 tensor(s) differ" in loader_verdict(found)


def test_the_check_names_parameters_and_shapes_too(tmp_path):
    write_model_dir(build_model(load_config("llama", tiny=True), seed=3), tmp_path)
    reference = hf_reference_model(tmp_path)
    model = load_model_dir(tmp_path)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    model.model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(torch.zeros(3, 3))
    found = {m.name: m for m in loader_mismatches(model, reference)}
    assert found["model.norm.weight"].kind == "parameter" and found["model.norm.weight"].problem == "values"
    assert found["model.layers.0.mlp.up_proj.weight"].problem == "shape"


def test_a_port_check_over_a_wrongly_loaded_model_blames_the_loader(tmp_path, monkeypatch):
    """port --check on a directory: the loader self-check fails, names the buffer, and the run exits 1,
    even though the port's own host embeddings (from the config) are right."""
    import json

    from tests.helpers import break_embed_scale, run_cli

    write_model_dir(build_model(load_config("gemma-3", tiny=True), seed=3), tmp_path)
    break_embed_scale(monkeypatch)
    res = run_cli("port", str(tmp_path), "--max-new-tokens", "4", "--ignore-eos", "--check", "--json")
    assert res.returncode == 1
    checks = {c["name"]: c for c in json.loads(res.stdout)["self_checks"]}
    assert checks["loader"]["status"] == "fail" and "embed_scale: 2.1e-25 here" in checks["loader"]["detail"]
    assert "loader, not the port" in checks["loader"]["detail"]


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
