"""Generation runtime: sampling runs, streaming, stop strings, KV-length growth, static batching."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_port import load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.errors import BucketError
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationParams, GenerationRequest, GenerationResult
from neuron_port.generation.sampling import SamplingParams
from neuron_port.generation.static_batch import stream_static
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model
from neuron_port.model.localdir import build_tokenizer
from tests.helpers import run_cli

_TINY_E2B = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)


@pytest.fixture(scope="module")
def e2b():
    return _TINY_E2B


def _port(model, buckets=(32,), kv_lens=(128,)):
    return Port.over_model(model, PortShape(list(buckets), list(kv_lens)))


def _one(port, prompt, params, tokenizer=None) -> GenerationResult:
    """A one-prompt request through the public ``generate``."""
    return generate(port, GenerationRequest([prompt], params), tokenizer=tokenizer)


def _prompt(n, offset=0):
    return [2] + [(17 * i + offset) % 500 + 4 for i in range(n - 1)]


def test_seeded_sampling_repeats_exactly_and_seeds_differ(e2b):
    port = _port(e2b)
    sampling = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    a = _one(port, _prompt(12), GenerationParams(24, sampling, seed=7)).tokens
    b = _one(port, _prompt(12), GenerationParams(24, sampling, seed=7)).tokens
    c = _one(port, _prompt(12), GenerationParams(24, sampling, seed=8)).tokens
    assert a == b and a != c


def test_streaming_yields_the_same_tokens_as_a_run(e2b):
    port, tok = _port(e2b), build_tokenizer(512)
    params = GenerationParams(20, SamplingParams(temperature=0.7, top_k=20), seed=3)
    events = list(stream_static(port, GenerationRequest([_prompt(10)], params), tok))
    done = _one(port, _prompt(10), params, tok)
    assert [e.token_id for e in events] == done.tokens[0]
    assert [e.index for e in events] == list(range(len(done.tokens[0])))
    assert "".join(e.text for e in events) == done.texts[0]
    assert events[-1].finish_reason == done.finish_reasons[0] == "length"
    assert all(e.finish_reason is None for e in events[:-1])
    assert all(e.host_ms >= 0 and e.graph_ms >= 0 for e in events)


def test_stop_strings_cut_at_the_right_place(e2b):
    port, tok = _port(e2b), build_tokenizer(512)
    free = _one(port, _prompt(10), GenerationParams(30), tok).texts[0]
    words = free.split(" ")
    assert len(words) > 6
    stop = " ".join(words[4:6])  # a two-word stop string in the middle of the free-running text
    cut = _one(port, _prompt(10), GenerationParams(30, stop_strings=(stop,)), tok)
    assert cut.finish_reasons[0] == "stop"
    assert cut.texts[0] == free[: free.index(stop)]
    request = GenerationRequest([_prompt(10)], GenerationParams(30, stop_strings=(stop,)))
    streamed = "".join(e.text for e in stream_static(port, request, tok))
    assert streamed == cut.texts[0] and stop not in streamed
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        _one(port, _prompt(10), GenerationParams(30, stop_strings=(stop,)))


def test_stop_token_ids(e2b):
    port = _port(e2b)
    free = _one(port, _prompt(10), GenerationParams(20)).tokens[0]
    stop_at = free[5]
    cut = _one(port, _prompt(10), GenerationParams(20, stop_token_ids=(stop_at,)))
    assert cut.tokens[0] == free[: free.index(stop_at) + 1] and cut.finish_reasons[0] == "stop"


def test_kv_growth_copies_the_cache_and_matches_hf(e2b):
    prompt = _prompt(20)
    ref = reference_generate(e2b, prompt, 40, [])["tokens"]
    # window 8 < 32: rings at both lengths; 20 + 40 positions outgrow 32 and move to 64
    grown = _one(_port(e2b, buckets=(24,), kv_lens=(32, 64)), prompt, GenerationParams(40))
    assert grown.tokens[0] == ref and grown.kv_len == 64
    # KV length 8 == window: sliding owners use full-length buffers, then become rings at 32
    port = _port(e2b, buckets=(8,), kv_lens=(8, 32))
    assert _one(port, prompt[:6], GenerationParams(20)).tokens[0] == reference_generate(e2b, prompt[:6], 20, [])["tokens"]


def test_kv_full_stops_with_length_when_asked(e2b):
    done = _one(_port(e2b, buckets=(24,), kv_lens=(32, 64)), _prompt(20), GenerationParams(40, on_kv_full="stop"))
    assert done.finish_reasons[0] == "length" and len(done.tokens[0]) == 32 - 20 + 1
    assert len(_one(_port(e2b, buckets=(24,), kv_lens=(32,)), _prompt(20), GenerationParams(40)).tokens[0]) == 13


def test_prompt_over_largest_bucket(e2b):
    with pytest.raises(BucketError, match="33 tokens.*largest prompt bucket \\(32\\)"):
        _one(_port(e2b, buckets=(16, 32)), _prompt(33), GenerationParams(4))


def test_a_request_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="every prompt at least one token"):
        GenerationRequest([[2, 5], []])
    with pytest.raises(ValueError, match="2 prompts but 3 parameter sets"):
        GenerationRequest([[2], [3]], [GenerationParams(4)] * 3)


def test_a_result_crosses_a_process_whole():
    result = GenerationResult([[5, 6]], ["ab"], ["length"], prefill_s=0.5, decode_steps=1, kv_len=64,
                              step_logits=[torch.arange(6.0).reshape(1, 6)], per_rank_kv_cache_bytes=[128])
    back = GenerationResult.from_wire(json.loads(json.dumps(result.to_wire())))
    assert back.tokens == result.tokens and back.texts == ["ab"] and back.kv_len == 64
    assert torch.equal(back.step_logits[0], result.step_logits[0])
    assert "step_logits" not in result.to_json() and result.to_json()["kv_cache_bytes"] == 128


def test_static_batch_rows_equal_solo_runs(e2b):
    port = _port(e2b, buckets=(32,), kv_lens=(64,))
    prompts = [_prompt(n, offset=n) for n in (24, 9, 17, 3)]
    params = [GenerationParams(30), GenerationParams(12), GenerationParams(30), GenerationParams(25)]
    batch = generate(port, GenerationRequest(prompts, params))
    for prompt, p, got in zip(prompts, params, batch.tokens, strict=True):
        solo = _one(port, prompt, p).tokens[0]
        assert got == solo
        assert got == reference_generate(e2b, prompt, p.max_new_tokens, [])["tokens"]


def test_port_cli_batch_of_four_checked_row_by_row():
    res = run_cli("port", "gemma-4-e2b", "--tiny", "--batch", "4", "--check", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["seq_match"] is True and len(d["rows"]) == 4
    assert len({r["prompt_tokens"] for r in d["rows"]}) == 4
    assert all(r["seq_match"] for r in d["rows"])
    assert d["host_ms_per_token"] > 0


@given(st.integers(1, 4), st.sampled_from([(16, 8), (32, None), (8, None), (64, 8)]), st.data())
@settings(max_examples=40)
def test_preallocated_decode_inputs_equal_the_reference_builders(batch, kv_ring, data):
    """The in-place scratch path gives exactly the masks/writes/embeddings of the reference functions."""
    kv_len, ring = kv_ring
    model = _TINY_E2B  # the port builds its graphs over its own copy
    port = Port.over_model(model, PortShape([8], [kv_len], ring_buffers=ring is not None))
    assert port.stores.rings[kv_len] == ring
    for _ in range(3):  # reuse the same scratch tensors across steps
        positions = torch.tensor(data.draw(st.lists(st.integers(0, kv_len - 1), min_size=batch, max_size=batch)))
        tokens = torch.tensor(data.draw(st.lists(st.integers(0, 511), min_size=batch, max_size=batch)))
        want = port.inputs.decode_fresh(tokens, positions, kv_len)
        got = port.inputs.decode(tokens, positions, kv_len)
        for name, a, b in zip(("embeds", "per_layer", "positions", "mask_full", "mask_sliding", "write_full",
                               "write_sliding", "last"), got, want, strict=True):
            assert a.shape == b.shape and torch.equal(a, b), name


def test_decode_step_reuses_its_buffers(e2b):
    port = Port.over_model(e2b, PortShape([8], [32]))
    first = port.inputs.decode(torch.tensor([5]), torch.tensor([9]), 32)
    second = port.inputs.decode(torch.tensor([6]), torch.tensor([10]), 32)
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(first, second, strict=True))


def test_port_stays_usable_outside_the_inference_mode_loop(e2b):
    """The loop runs in inference mode; the port's reused decode inputs (first made inside it)
    must still fill, and its stores still take in-place writes, in ordinary code afterwards."""
    port = Port.over_model(e2b, PortShape([8], [32]))
    generate(port, GenerationRequest.greedy([[2, 5, 7]], 3))
    inputs = port.inputs.decode(torch.tensor([5]), torch.tensor([9]), 32)
    assert not any(t.is_inference() for t in inputs)
    want = port.inputs.decode_fresh(torch.tensor([5]), torch.tensor([9]), 32)
    assert all(torch.equal(a, b) for a, b in zip(inputs, want, strict=True))
