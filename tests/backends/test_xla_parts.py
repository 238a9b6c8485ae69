"""The parts of the XLA path that need no torch-xla: HLO text parsing, the SPMD layout of a shard
plan, and the transformers version gate (the lint findings are in tests/checks/test_xla_lint.py)."""


from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from neuron_port import describe, load_config
from neuron_port.backends.hlo_text import aliased_buffers, summarize
from neuron_port.backends.spmd import COLUMN, ROW, spmd_model, weight_splits
from neuron_port.checks.oracle import reference_generate
from neuron_port.errors import ShardingError
from neuron_port.families import family_for
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config_dict, tiny_config_dict
from neuron_port.model.loading import build_model
from neuron_port.parallel.launch import identity_reduce
from neuron_port.parallel.ranks import RankSetup, make_rank

MODULE = ("HloModule SyncTensorsGraph.42, is_scheduled=true, "
          "input_output_alias={ {0}: (3, {}, may-alias), {1}: (4, {}, may-alias) }, "
          "entry_computation_layout={(f32[2]{0})->(f32[2]{0})}") + """

%fused_add (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %add.1 = f32[2]{0} add(f32[2]{0} %p, f32[2]{0} %p)
}

ENTRY %main (a: f32[2], b: f32[<=8]) -> (f32[2], f32[2]) {
  %a = f32[2]{0} parameter(0)
  %b = f32[<=8]{0} parameter(1)
  %all-reduce = f32[2]{0} all-reduce(f32[2]{0} %a), replica_groups={{0,1}}, to_apply=%sum
  %fusion = f32[2]{0} fusion(f32[2]{0} %all-reduce), kind=kLoop, calls=%fused_add
  ROOT %tuple = (f32[2]{0}, /*index=1*/f32[2]{0}) tuple(f32[2]{0} %fusion, f32[2]{0} %a)
}
"""


def test_hlo_summary_counts_instructions_opcodes_aliases_and_dynamic_dims():
    s = summarize(MODULE)
    assert s.instructions == 7
    assert s.opcodes["parameter"] == 3 and s.opcodes["all-reduce"] == 1 and s.opcodes["tuple"] == 1
    assert s.aliased_buffers == 2 and s.dynamic_dimensions == 1
    assert aliased_buffers(MODULE.replace("input_output_alias={ {0}: (3, {}, may-alias), {1}: (4, {}, may-alias) }, ", "")) == 0


INT8_MODULE = """HloModule m, entry_computation_layout={(s8[4,3]{1,0}, f32[2,3]{1,0}, s8[5]{0})->f32[2,4]{1,0}}

%fused_dot (param_0.1: s8[4,3], param_1.2: f32[2,3]) -> f32[2,4] {
  %param_0.1 = s8[4,3]{1,0} parameter(0)
  %convert.7 = f32[4,3]{1,0} convert(%param_0.1)
  %param_1.2 = f32[2,3]{1,0} parameter(1)
  %convert.8 = f32[2,3]{1,0} convert(%param_1.2)
  ROOT %dot.3 = f32[2,4]{1,0} dot(%param_1.2, %convert.7), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

ENTRY %main (w: s8[4,3], x: f32[2,3], idx: s8[5]) -> f32[2,4] {
  %w = s8[4,3]{1,0} parameter(0)
  %x = f32[2,3]{1,0} parameter(1)
  %idx = s8[5]{0} parameter(2)
  ROOT %fusion.2 = f32[2,4]{1,0} fusion(%w, %x), kind=kOutput, calls=%fused_dot
}
"""


def test_int8_entry_parameters_and_their_converts_are_counted():
    """Entry parameters only (a fusion's s8 parameter is the same buffer), with their bytes; converts
    whose operand is s8, looked up by name (a float convert does not count)."""
    s = summarize(INT8_MODULE)
    assert (s.int8_parameters, s.int8_parameter_bytes, s.int8_converts) == (2, 17, 1)
    assert summarize(MODULE).int8_parameters == summarize(MODULE).int8_converts == 0


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=0, max_size=12, unique_by=lambda t: t[0]))
def test_alias_entries_are_counted_exactly(pairs):
    body = ", ".join(f"{{{o}}}: ({i}, {{}}, may-alias)" for o, i in pairs)
    text = f"HloModule m, input_output_alias={{ {body} }}, entry_computation_layout={{()->()}}\n" if pairs else "HloModule m\n"
    assert aliased_buffers(text) == len(pairs)


# ---- the SPMD layout of a shard plan -----------------------------------------------------------
@pytest.mark.parametrize("name,tp", [("gemma-4-12b", 2), ("gemma-4-e4b", 2), ("llama", 4)])
def test_spmd_model_is_the_same_model_and_its_even_slices_are_the_ranks(name, tp):
    model = build_model(load_config(name, tiny=True), seed=0)
    setup = RankSetup.for_layout(describe(model), tp)
    spread, kv_heads = spmd_model(model, setup)
    # the same function: eager graphs over the spread model (on one CPU) give Hugging Face's tokens
    prompt = [2] + list(range(20, 40))
    port = Port.over_model(spread, PortShape([32], [64]), setup.layout, kv_heads)
    assert generate(port, GenerationRequest.greedy([prompt], 12)).tokens[0] == reference_generate(model, prompt, 12).tokens
    # device r's even slice of every split weight is rank r's shard
    splits = list(weight_splits(spread, setup))
    assert {spec for _, spec in splits} <= {COLUMN, ROW, ("tp",)}
    for r in range(tp):
        shard = dict(make_rank(setup, r, identity_reduce, model).model.named_parameters())
        names = {id(p): n for n, p in spread.named_parameters()}
        for tensor, spec in splits:
            dim = 0 if spec[0] == "tp" else 1
            assert torch.equal(tensor.chunk(tp, dim=dim)[r], shard[names[id(tensor)]]), names[id(tensor)]
    assert all(n % tp == 0 for n in kv_heads.values())


def test_spmd_refuses_a_straddling_plan():
    text = tiny_config_dict(load_config_dict("gemma-4-e4b"))
    text.update(num_attention_heads=6, num_key_value_heads=3)
    model = build_model(family_for(text["model_type"]).make_config(text), seed=0)
    with pytest.raises(ShardingError, match="straddles KV groups"):
        spmd_model(model, RankSetup.for_layout(describe(model), 2))


def test_spmd_layout_carries_biases_of_the_split_projections():
    """Llama with attention biases: the expanded K/V biases and the split q bias are the ranks' too."""
    from neuron_port.model.configs import load_config_dict

    text = {**tiny_config_dict(load_config_dict("llama")), "attention_bias": True}
    model = build_model(family_for("llama").make_config(text), seed=0)
    for layer in family_for("llama").decoder_layers(model):
        for proj in family_for("llama").attention_projections(family_for("llama").attention(layer)).values():
            if proj is not None and proj.bias is not None:
                torch.nn.init.normal_(proj.bias, std=0.5)  # visible biases (they start at zero)
    setup = RankSetup.for_layout(describe(model), 4)  # 2 kv heads over 4 ranks: replicated
    spread, kv_heads = spmd_model(model, setup)
    prompt = [2] + list(range(20, 40))
    port = Port.over_model(spread, PortShape([32], [64]), setup.layout, kv_heads)
    assert generate(port, GenerationRequest.greedy([prompt], 10)).tokens[0] == reference_generate(model, prompt, 10).tokens
    names = {id(p): n for n, p in spread.named_parameters()}
    biases = [(t, spec) for t, spec in weight_splits(spread, setup) if t.dim() == 1]
    assert biases and all(spec == ("tp",) for _, spec in biases)
    for r in range(4):
        shard = dict(make_rank(setup, r, identity_reduce, model).model.named_parameters())
        for tensor, _ in biases:
            assert torch.equal(tensor.chunk(4)[r], shard[names[id(tensor)]]), names[id(tensor)]


def test_the_runtime_takes_the_grad_mode_its_runners_allow(tiny_e2b):
    from neuron_port.generation.offline import run_request
    from neuron_port.generation.request import GenerationRequest
    port = Port.over_model(tiny_e2b, PortShape([16], [32]))
    for allowed in (True, False):
        port.runners.inference_mode = allowed
        seen = []
        original = port.runners.decode[32]
        port.runners.decode[32] = lambda *a, _f=original, _seen=seen: (_seen.append(torch.is_inference_mode_enabled()), _f(*a))[1]
        heard = []
        run_request(port, GenerationRequest.greedy([[2, 5, 6]], 4),
                    on_token=lambda event, _heard=heard: _heard.append(torch.is_inference_mode_enabled()))
        assert heard == [False] * 4  # not held while the caller handles an event
        assert seen and all(s == allowed for s in seen)
        port.runners.decode[32] = original


def test_spmd_layout_of_an_int8_model_splits_scales_with_their_rows():
    """The int8 weights (buffers) split as the float ones; a column projection's scales split with its rows,
    a row-parallel one's stay whole; device r's slices are rank r's int8 shard, scales included."""
    from neuron_port.model.quant import Int8Linear, apply_quant

    model = apply_quant(build_model(load_config("gemma-4-e4b", tiny=True), seed=0), "int8")
    setup = RankSetup.for_layout(describe(model), 2)
    spread, kv_heads = spmd_model(model, setup)
    prompt = [2] + list(range(20, 40))
    port = Port.over_model(spread, PortShape([32], [64]), setup.layout, kv_heads)
    assert generate(port, GenerationRequest.greedy([prompt], 10)).tokens[0] == reference_generate(model, prompt, 10).tokens
    splits = list(weight_splits(spread, setup))
    names = {id(t): n for n, t in [*spread.named_parameters(), *spread.named_buffers()]}
    scales = {n for t, _ in splits if (n := names[id(t)]).endswith(".scale")}
    assert scales and not any(".o_proj." in n or ".down_proj." in n for n in scales)  # row-parallel: replicated
    assert any(isinstance(m, Int8Linear) for m in spread.modules())
    for r in range(2):
        shard = make_rank(setup, r, identity_reduce, model).model
        state = dict([*shard.named_parameters(), *shard.named_buffers()])
        for tensor, spec in splits:
            dim = 0 if spec[0] == "tp" else 1
            assert torch.equal(tensor.chunk(2, dim=dim)[r], state[names[id(tensor)]]), names[id(tensor)]
        for name, m in shard.named_modules():  # and every replicated scale is the whole row's
            if name.endswith(("o_proj", "down_proj")):
                assert torch.equal(m.scale, dict(spread.named_buffers())[f"{name}.scale"]), name
