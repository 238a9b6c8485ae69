"""The self-checks catch what matching greedy tokens cannot, and pass on correct ports.

Each check is shown failing on the mistake it exists for: an embedding scale left out of the
host gather, per-layer inputs scaled wrongly, attention modules that kept Hugging Face's own
attention function through a config copy, and logits without the final softcap.
"""


from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port import describe, load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.checks.selfcheck import LOGIT_TOLERANCE, check_attention, check_embeddings, check_logits, probe_ids
from neuron_port.families import DecoderFamily, Phi3Family
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model
from neuron_port.parallel.ranks import RankSetup

SHAPE = PortShape(16, 32)


def test_probe_ids_span_the_vocabulary():
    ids = probe_ids(512)
    assert ids.shape == (1, 64) and int(ids.min()) == 0 and int(ids.max()) == 511
    assert probe_ids(10).shape == (1, 10)


def test_embedding_scale_left_out_is_named():
    model = build_model(load_config("gemma-3", tiny=True), seed=0)
    assert check_embeddings(model).status == "pass"
    plain = HostEmbeddings.from_model(model)
    unscaled = HostEmbeddings(plain.word, None, plain.num_layers, 0, word_scale=None)
    check = check_embeddings(model, unscaled)
    assert check.status == "fail" and "word embedding" in check.detail and "8x" in check.detail
    assert "embedding_scales" in check.fix


def test_per_layer_inputs_scaled_wrongly_are_named(tiny_e2b):
    good = HostEmbeddings.from_model(tiny_e2b)
    assert check_embeddings(tiny_e2b, good).status == "pass"
    wrong = HostEmbeddings(good.word, good.ple, good.num_layers, good.per_layer, word_scale=float(good.word_scale),
                           ple_scale=1.0)
    check = check_embeddings(tiny_e2b, wrong)
    assert check.status == "fail" and "per-layer inputs" in check.detail and "word" not in check.detail


@pytest.mark.parametrize("tp", [1, 2])
def test_attention_sentinel_passes_on_every_rank(tp):
    model = build_model(load_config("phi-3", tiny=True), seed=0)
    check = check_attention(model, RankSetup.for_layout(describe(model), tp), SHAPE)
    assert check.status == "pass" and f"{tp} rank(s)" in check.detail


def test_a_config_copy_that_keeps_hf_attention_is_caught(monkeypatch):
    """The bug of the trial: the implementation set on the model's config only, while each sharded
    Phi-3 attention module reads a config copy made when sharding. Tokens still matched at tp 2 with
    4q/2kv by luck; the sentinel sees the layers that never called the library's function."""
    monkeypatch.setattr(Phi3Family, "use_attention",
                        lambda self, model, impl: DecoderFamily.set_attention_implementation(self, model.config, impl))
    model = build_model(load_config("phi-3", tiny=True), seed=0)
    check = check_attention(model, RankSetup.for_layout(describe(model), 2), SHAPE)
    assert check.status == "fail"
    assert "rank 0: layers [0, 1, 2, 3]" in check.detail and "use_attention" in check.fix
    assert "the run stopped at RuntimeError" in check.detail  # HF's repeat_kv cannot serve a straddling rank


def test_a_config_copy_is_caught_where_tokens_match_by_luck(monkeypatch):
    """4 q / 2 kv heads at tp 2: HF's own attention computes the right thing on each rank, so tokens
    would match; the sentinel still sees that the library's function never ran."""
    from neuron_port.families import family_for
    from neuron_port.model.configs import load_config_dict, tiny_config_dict

    monkeypatch.setattr(Phi3Family, "use_attention",
                        lambda self, model, impl: DecoderFamily.set_attention_implementation(self, model.config, impl))
    text = tiny_config_dict(load_config_dict("phi-3"))
    text.update(num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    model = build_model(family_for("phi3").make_config(text), seed=0)
    check = check_attention(model, RankSetup.for_layout(describe(model), 2), SHAPE)
    assert check.status == "fail" and "rank 1: layers [0, 1, 2, 3]" in check.detail
    assert "stopped" not in check.detail
    prompt = [2] + list(range(7, 30))
    got = generate(model, GenerationRequest.greedy([prompt], 12), shape=PortShape(32, 64), tp=2, mode="threads")
    assert got.tokens[0] == reference_generate(model, prompt, 12).tokens  # what tokens alone would say


def test_a_run_that_stops_names_the_layers_it_never_reached(monkeypatch):
    """A mask in a form the text model ignores: the library's attention refuses at layer 0, and the
    layers after it are reported as not reached, not as running another function."""
    from neuron_port.families import MistralFamily

    monkeypatch.setattr(MistralFamily, "attention_mask_argument", lambda self, masks: None)
    model = build_model(load_config("mistral", tiny=True), seed=0)
    check = check_attention(model, RankSetup.for_layout(describe(model), 1), SHAPE)
    assert check.status == "fail"
    assert check.detail.startswith("the graphs failed before rank 0: layers [1, 2, 3] ran: MaskFormError")
    assert "got no mask" in check.detail and "another attention function" not in check.detail


def test_a_forgotten_softcap_is_a_logit_failure_with_the_same_argmax():
    torch.manual_seed(0)
    raw = [torch.randn(512) * 40 for _ in range(4)]
    capped = [torch.tanh(r / 30.0) * 30.0 for r in raw]
    assert all(int(r.argmax()) == int(c.argmax()) for r, c in zip(raw, capped, strict=True))
    assert check_logits(raw, capped, 30.0)[0].status == "pass"
    check, report = check_logits(raw, capped, None)
    assert check.status == "fail" and "softcap" in check.fix and report.max_relative_error > 0.1


@settings(max_examples=30, deadline=None, derandomize=True)
@given(scale=st.floats(0.0, 0.9), step=st.integers(0, 5), sign=st.sampled_from([-1.0, 1.0]))
def test_logit_tolerance_is_relative_to_the_largest_logit(scale, step, sign):
    """Errors under the tolerance (relative to the largest |logit| of the step) pass; over it, the step is named."""
    reference = [torch.linspace(-7.0, 11.0, 64) for _ in range(6)]
    largest = 11.0
    small = [r.clone() for r in reference]
    small[step][3] += sign * scale * LOGIT_TOLERANCE * largest
    assert check_logits(small, reference, None)[0].status == "pass"
    big = [r.clone() for r in reference]
    big[step][3] += sign * (1.5 + scale) * LOGIT_TOLERANCE * largest
    check, report = check_logits(big, reference, None)
    assert check.status == "fail" and report.worst_step == step and f"step {step}" in check.detail


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_fail_and_the_report_stays_json(bad):
    import json

    reference = [torch.linspace(-7.0, 11.0, 64) for _ in range(3)]
    ours = [r.clone() for r in reference]
    ours[1][5] = bad
    check, report = check_logits(ours, reference, 30.0)
    assert check.status == "fail" and "NaN or infinite" in check.detail and report.non_finite_steps == [1]
    json.loads(json.dumps(report.to_json(), allow_nan=False))
    embeddings = HostEmbeddings.from_model(build_model(load_config("llama", tiny=True), seed=0))
    model = build_model(load_config("llama", tiny=True), seed=0)
    embeddings.word = embeddings.word.clone()
    embeddings.word[0, 0] = bad
    assert check_embeddings(model, embeddings).status == "fail"
