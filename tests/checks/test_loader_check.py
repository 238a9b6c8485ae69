"""The loader check names what a wrong loader leaves behind: buffers, parameters, shapes, and who a port check
blames."""


from __future__ import annotations

import torch

from neuron_port import load_config
from neuron_port.checks.loader_check import loader_mismatches, loader_verdict
from neuron_port.checks.reference import hf_reference_model
from neuron_port.model.loading import build_model, load_model_dir, nonpersistent_buffer_owners
from neuron_port.model.localdir import write_model_dir


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
