"""The two-graph port: logits equal Hugging Face's teacher-forced ones over window wraps, buffers restored,
graph aliases and static inputs."""


import torch

from neuron_port import load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.generate import generate
from neuron_port.generation.logits import softcap
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.shapes import PortShape
from neuron_port.model.buffers import audit_buffers, parameter_only_load, restore_buffers
from neuron_port.model.loading import build_model


def test_port_logits_match_hf_teacher_forced_over_window_wraps():
    """Per-step logits of the port against HF's own full forward on the same tokens (window 8, 72 positions).

    HF's cached ``generate`` and its full forward differ by float noise themselves (~1.7e-4 relative
    here); the port must be no farther from the full forward than HF's own cached path is.
    """
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=3)
    prompt = [2] + list(range(10, 33))
    got = generate(model, GenerationRequest.greedy([prompt], 48, keep_logits=True), shape=PortShape([32], 128))
    ref = reference_generate(model, prompt, 48, [])
    assert got.tokens[0] == ref.tokens
    with torch.no_grad():
        hf = model(torch.tensor([prompt + got.tokens[0]])).logits[0]
    port_logits = softcap(torch.stack(got.step_logits)[:, 0], 30.0)
    want = hf[len(prompt) - 1 : len(prompt) - 1 + port_logits.shape[0]]
    scale = want.abs().max()
    port_err = (port_logits - want).abs().max() / scale
    hf_self_err = (torch.stack(ref.logits) - want).abs().max() / scale
    assert port_err <= 2 * hf_self_err + 1e-5, (port_err, hf_self_err)


def test_restoring_buffers_fixes_a_parameter_only_load():
    model = build_model(load_config("gemma-4-e4b", tiny=True), seed=0)
    checkpoint = model.state_dict()
    broken = build_model(load_config("gemma-4-e4b", tiny=True), seed=99)
    parameter_only_load(broken, checkpoint)
    problems = audit_buffers(broken, checkpoint)
    assert problems and all("layer_scalar" in p.name for p in problems)
    prompt = [2] + list(range(40, 63))
    shape = PortShape([32], 128)
    reference = reference_generate(model, prompt, 16, []).tokens
    assert generate(broken, GenerationRequest.greedy([prompt], 16), shape=shape).tokens[0] != reference
    restored = restore_buffers(broken, checkpoint)
    assert len(restored) == len(problems)
    assert audit_buffers(broken, checkpoint) == []
    assert generate(broken, GenerationRequest.greedy([prompt], 16), shape=shape).tokens[0] == reference


def test_graph_aliases_and_static_inputs():
    model = build_model(load_config("gemma-4-12b", tiny=True), seed=0)
    from neuron_port.graph.port import Port
    from neuron_port.graph.step import INPUT_NAMES

    port = Port.over_model(model, PortShape([16], 64))
    n, decode = len(port.stores.largest.slots), port.graphs.decode[port.kv_len]
    assert decode.aliases == {len(INPUT_NAMES) + j: 1 + j for j in range(2 * n)}
    inputs = port.inputs.decode_fresh(torch.tensor([5]), torch.tensor([20]))
    out = decode(*inputs, *port.inputs.new_store(1, port.kv_len))
    assert out[0].shape == (1, model.config.vocab_size)
    assert [t.shape for t in out[1:]] == [t.shape for t in port.inputs.new_store(1, port.kv_len)]
