"""Weight-only int8 per output channel: every element within half a step of its scale, the projection
computes with exactly the dequantized weight, and a quantized tiny model still runs through the port
as Hugging Face's own forward of the same quantized model does."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.generate import generate
from neuron_port.generation.logits import softcap
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config
from neuron_port.model.layout import describe
from neuron_port.model.loading import QUANT_KEY, build_model, cast_weights, load_model_dir, model_from_name, save_model_dir
from neuron_port.model.quant import (
    QMAX,
    Int8Linear,
    apply_quant,
    fp32_keys,
    quant_of,
    quantize_head,
    quantize_model,
    quantize_rows,
    scheme_flags,
    scheme_from_flags,
)


@given(st.integers(1, 6), st.integers(1, 9), st.floats(1e-3, 1e3), st.integers(0, 999))
@settings(max_examples=60, deadline=None)
def test_every_element_is_within_half_a_step(rows, cols, magnitude, seed):
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * magnitude
    weight[0] = 0.0  # an all-zero row keeps a finite scale
    q, scale = quantize_rows(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (rows,)
    assert int(q.abs().max()) <= QMAX and torch.all(scale > 0)
    error = (weight - q.double() * scale.double()[:, None]).abs()
    assert torch.all(error <= scale.double()[:, None] / 2 * (1 + 1e-6))
    for r in range(1, rows):  # each row's peak maps to +-127: the whole int8 range is used
        assert int(q[r].abs().max()) == QMAX or float(weight[r].abs().max()) == 0.0


def test_the_projection_computes_with_the_dequantized_weight():
    linear = torch.nn.Linear(16, 8, bias=True)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(3, 5, 16)
    want = torch.nn.functional.linear(x, layer.dequantized(), linear.bias)
    assert torch.allclose(layer(x), want, atol=1e-5, rtol=1e-5)
    assert (layer(x) - linear(x)).abs().max() < 0.05 * linear(x).abs().max()  # and near the float projection
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="expected an int8 weight"):
        Int8Linear(layer.weight.float(), layer.scale)
    with pytest.raises(ValueError, match=r"\[out, in\], found shape \(4,\)"):
        quantize_rows(torch.ones(4))


def test_a_quantized_model_runs_through_the_port_as_hugging_face_runs_it():
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    float_logits = model(torch.tensor([[2, 5, 9, 14]])).logits
    layout = describe(model)
    projections = [m for spec, layer in zip(layout.layers, layout.family.decoder_layers(model), strict=True)
                   for part in layout.family.layer_projections(layer, spec.index) for m in part.values() if m is not None]
    replaced = quantize_model(model)
    assert replaced == len(projections) and sum(isinstance(m, Int8Linear) for m in model.modules()) == replaced
    int8_logits = model(torch.tensor([[2, 5, 9, 14]])).logits
    assert 0 < (int8_logits - float_logits).abs().max() < 0.1 * float_logits.abs().max()  # changed, but a little
    prompt = [2] + list(range(40, 60))
    port = Port.over_model(model, PortShape([32], [64]))
    got = generate(port, GenerationRequest.greedy([prompt], 16, keep_logits=True))
    reference = reference_generate(model, prompt, 16)  # the oracle: HF's own forward of the same int8 model
    assert got.tokens[0] == reference.tokens
    ours = softcap(torch.stack([step[0] for step in got.step_logits]), layout.softcap)
    theirs = torch.stack(reference.logits)
    assert (ours - theirs).abs().max() < 1e-4 * theirs.abs().max()  # every step, relative to the largest logit
    with pytest.raises(NotImplementedError, match="fused projections"):
        quantize_model(build_model(load_config("phi-3", tiny=True)))


def test_the_scales_stay_fp32_through_every_cast_and_a_scheme_applies_once():
    model = apply_quant(build_model(load_config("gemma-4-e2b", tiny=True), seed=0), "int8")
    assert quant_of(model) == "int8" and quant_of(build_model(load_config("llama", tiny=True))) == "none"
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    model.to(torch.bfloat16)
    cast_weights(model, torch.bfloat16)
    assert all(m.scale.dtype == torch.float32 and m.weight.dtype == torch.int8 for m in layers)
    assert model.model.norm.weight.dtype == torch.bfloat16  # the rest did follow the cast
    assert set(fp32_keys(model)) == {f"{name}.scale" for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    with pytest.raises(ValueError, match="already quantized"):
        apply_quant(model, "int8")
    with pytest.raises(ValueError, match="quant must be one of none, int8, int8\\+head, found 'int4'"):
        apply_quant(model, "int4")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int8_directory_loads_back_as_the_same_int8_model(tmp_path, dtype):
    """save_model_dir records the scheme; load_model_dir rebuilds int8 projections and keeps the scales fp32
    (the gloo ranks load a model in memory this way); model_from_name quantizes the float32 weights first."""
    model = model_from_name("gemma-4-e2b", tiny=True, dtype=dtype, quant="int8")
    saved = save_model_dir(model, tmp_path / "int8")
    assert json.loads((saved / "config.json").read_text())[QUANT_KEY] == "int8"
    loaded = load_model_dir(saved, dtype=dtype)
    assert loaded_state_equals(loaded, model)
    float_quantized = model_from_name("gemma-4-e2b", tiny=True, quant="int8")
    assert all(torch.equal(a.weight, b.weight) and torch.equal(a.scale, b.scale)  # the same int8 in every dtype
               for a, b in zip(int8_layers(model), int8_layers(float_quantized), strict=True))
    ids = torch.tensor([[2, 5, 9, 14]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def int8_layers(model):
    return [m for m in model.modules() if isinstance(m, Int8Linear)]


def loaded_state_equals(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


def test_an_int8_head_is_untied_from_the_word_table_and_computes_the_logits():
    """--quant-head: the tied head becomes its own int8 matrix (the word table the host gathers from stays
    float and untouched), the config no longer ties them, and the logits are the dequantized head's."""
    model = apply_quant(build_model(load_config("gemma-4-e2b", tiny=True), seed=0), "int8")
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied before
    table = model.model.embed_tokens.weight.detach().clone()
    ids = torch.tensor([[2, 5, 9, 14]])
    hidden = model.model(ids).last_hidden_state
    head = quantize_head(model)
    assert quant_of(model) == "int8+head" and model.lm_head is head and head.weight.dtype == torch.int8
    assert model.config.tie_word_embeddings is False and torch.equal(model.model.embed_tokens.weight, table)
    assert torch.allclose(model.lm_head(hidden), hidden @ head.dequantized().t(), atol=1e-5)
    model.tie_weights()  # transformers' own re-tie leaves the int8 head alone
    assert model.lm_head is head and model.lm_head.weight.dtype == torch.int8
    float_head = (hidden @ table.t()).abs().max()
    assert 0 < (model.lm_head(hidden) - hidden @ table.t()).abs().max() < 0.05 * float_head


def test_the_head_flag_folds_into_one_scheme():
    assert scheme_from_flags("int8", True) == "int8+head" and scheme_from_flags("int8", False) == "int8"
    assert scheme_from_flags("none", False) == "none" and scheme_flags("int8+head") == "--quant int8 --quant-head"
    with pytest.raises(ValueError, match="--quant-head .* needs --quant int8, found --quant none"):
        scheme_from_flags("none", True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int8_head_directory_loads_back_untied(tmp_path, dtype):
    model = model_from_name("gemma-4-e2b", tiny=True, dtype=dtype, quant="int8+head")
    saved = save_model_dir(model, tmp_path / "head")
    fields = json.loads((saved / "config.json").read_text())
    assert fields[QUANT_KEY] == "int8+head" and fields["tie_word_embeddings"] is False
    loaded = load_model_dir(saved, dtype=dtype)
    assert quant_of(loaded) == "int8+head" and loaded_state_equals(loaded, model)
    assert loaded.lm_head.scale.dtype == torch.float32 and loaded.model.embed_tokens.weight.dtype == dtype
    ids = torch.tensor([[2, 5, 9, 14]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_a_head_the_adapter_changes_or_a_fused_family_is_refused(monkeypatch):
    from neuron_port.errors import AdapterError

    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    family = describe(model).family
    with pytest.raises(ValueError, match="quantize the projections first"):
        quantize_head(model)  # a float model with an int8 head is no scheme
    monkeypatch.setattr(type(family), "lm_head_weight", lambda self, m: 2.0 * m.lm_head.weight)  # a folded scale
    with pytest.raises(AdapterError, match="changes the LM head's weight"):
        apply_quant(model, "int8+head")
    # nothing half-done: the projections, the head and the tie as they were
    assert quant_of(model) == "none" and isinstance(model.lm_head, torch.nn.Linear) and model.config.tie_word_embeddings
