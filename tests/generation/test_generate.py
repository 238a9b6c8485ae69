"""The one generate over a port: seeded sampling, streaming, stop strings and ids, decode by KV length, a batch
of rows on the one scheduler."""


import pytest
import torch

from neuron_port.checks.oracle import reference_generate
from neuron_port.errors import BucketError
from neuron_port.generation.generate import generate
from neuron_port.generation.offline import run_request
from neuron_port.generation.request import GenerationParams, GenerationRequest, GenerationResult
from neuron_port.generation.sampling import SamplingParams
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.localdir import build_tokenizer


def _port(model, buckets=(32,), kv_lens=(128,)):
    return Port.over_model(model, PortShape(list(buckets), list(kv_lens)))


def _one(port, prompt, params, tokenizer=None) -> GenerationResult:
    """A one-prompt request through the public ``generate``."""
    return generate(port, GenerationRequest([prompt], params), tokenizer=tokenizer)


def _prompt(n, offset=0):
    return [2] + [(17 * i + offset) % 500 + 4 for i in range(n - 1)]


def test_seeded_sampling_repeats_exactly_and_seeds_differ(tiny_e2b):
    port = _port(tiny_e2b)
    sampling = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    a = _one(port, _prompt(12), GenerationParams(24, sampling, seed=7)).tokens
    b = _one(port, _prompt(12), GenerationParams(24, sampling, seed=7)).tokens
    c = _one(port, _prompt(12), GenerationParams(24, sampling, seed=8)).tokens
    assert a == b and a != c


def test_streaming_yields_the_same_tokens_as_a_run(tiny_e2b):
    port, tok = _port(tiny_e2b), build_tokenizer(512)
    params = GenerationParams(20, SamplingParams(temperature=0.7, top_k=20), seed=3)
    events = []
    run_request(port, GenerationRequest([_prompt(10)], params), tok, on_token=events.append)
    done = _one(port, _prompt(10), params, tok)
    assert [e.token_id for e in events] == done.tokens[0]
    assert [e.index for e in events] == list(range(len(done.tokens[0])))
    assert "".join(e.text for e in events) == done.texts[0]
    assert events[-1].finish_reason == done.finish_reasons[0] == "length"
    assert all(e.finish_reason is None for e in events[:-1])
    assert all(e.host_ms >= 0 and e.graph_ms >= 0 for e in events)


def test_generate_hands_every_token_to_on_token_as_it_is_made(tiny_e2b):
    """``generate(model, ..., on_token=)`` (rank 0 in this process): each event as the token is made, the same
    tokens and text the result holds; the tp 2 run's ranks are gloo processes, which call it for none."""
    tok = build_tokenizer(512)
    request = GenerationRequest.greedy([_prompt(10)], 12)
    events = []
    result = generate(tiny_e2b, request, tokenizer=tok, shape=PortShape((16,), 32), on_token=events.append)
    assert [e.token_id for e in events] == result.tokens[0] and len(events) == 12
    assert "".join(e.text for e in events) == result.texts[0]


def test_stop_strings_cut_at_the_right_place(tiny_e2b):
    port, tok = _port(tiny_e2b), build_tokenizer(512)
    free = _one(port, _prompt(10), GenerationParams(30), tok).texts[0]
    words = free.split(" ")
    assert len(words) > 6
    stop = " ".join(words[4:6])  # a two-word stop string in the middle of the free-running text
    cut = _one(port, _prompt(10), GenerationParams(30, stop_strings=(stop,)), tok)
    assert cut.finish_reasons[0] == "stop"
    assert cut.texts[0] == free[: free.index(stop)]
    request = GenerationRequest([_prompt(10)], GenerationParams(30, stop_strings=(stop,)))
    events = []
    run_request(port, request, tok, on_token=events.append)
    streamed = "".join(e.text for e in events)
    assert streamed == cut.texts[0] and stop not in streamed
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        _one(port, _prompt(10), GenerationParams(30, stop_strings=(stop,)))


def test_stop_token_ids(tiny_e2b):
    port = _port(tiny_e2b)
    free = _one(port, _prompt(10), GenerationParams(20)).tokens[0]
    stop_at = free[5]
    cut = _one(port, _prompt(10), GenerationParams(20, stop_token_ids=(stop_at,)))
    assert cut.tokens[0] == free[: free.index(stop_at) + 1] and cut.finish_reasons[0] == "stop"


def test_decode_by_kv_length_reads_short_stores_and_matches_hf(tiny_e2b):
    prompt = _prompt(20)
    ref = reference_generate(tiny_e2b, prompt, 40, []).tokens
    # window 8 < 32: rings at both lengths; 20 + 40 positions outgrow 32: the steps move to the 64 graph
    grown = _one(_port(tiny_e2b, buckets=(24,), kv_lens=(32, 64)), prompt, GenerationParams(40))
    assert grown.tokens[0] == ref and grown.kv_len == 64
    # the first decode step writes position 20; positions 20..31 fit the 32 graph
    assert grown.step_kv_lens == [32] * (32 - 20) + [64] * (40 - 1 - (32 - 20))
    # KV length 8 == window: sliding owners use full-length buffers, then become rings at 32
    port = _port(tiny_e2b, buckets=(8,), kv_lens=(8, 32))
    assert _one(port, prompt[:6], GenerationParams(20)).tokens[0] == reference_generate(tiny_e2b, prompt[:6], 20, []).tokens


def test_a_full_store_stops_with_length_at_the_largest_kv_length(tiny_e2b):
    done = _one(_port(tiny_e2b, buckets=(24,), kv_lens=(32, 64)), _prompt(20), GenerationParams(60))
    assert done.finish_reasons[0] == "length" and len(done.tokens[0]) == 64 - 20 + 1
    one = _one(_port(tiny_e2b, buckets=(24,), kv_lens=(32,)), _prompt(20), GenerationParams(40))
    assert one.finish_reasons[0] == "length" and len(one.tokens[0]) == 32 - 20 + 1


def test_prompt_over_largest_bucket(tiny_e2b):
    with pytest.raises(BucketError, match="33 tokens.*largest prompt bucket \\(32\\)"):
        _one(_port(tiny_e2b, buckets=(16, 32)), _prompt(33), GenerationParams(4))


def test_batch_rows_equal_solo_runs(tiny_e2b):
    port = _port(tiny_e2b, buckets=(32,), kv_lens=(64,))
    prompts = [_prompt(n, offset=n) for n in (24, 9, 17, 3)]
    params = [GenerationParams(30), GenerationParams(12), GenerationParams(30), GenerationParams(25)]
    batch = generate(port, GenerationRequest(prompts, params))
    for prompt, p, got in zip(prompts, params, batch.tokens, strict=True):
        solo = _one(port, prompt, p).tokens[0]
        assert got == solo
        assert got == reference_generate(tiny_e2b, prompt, p.max_new_tokens, []).tokens


def test_port_stays_usable_outside_the_inference_mode_loop(tiny_e2b):
    """The loop runs in inference mode; the port's reused decode inputs (first made inside it)
    must still fill, and its stores still take in-place writes, in ordinary code afterwards."""
    port = Port.over_model(tiny_e2b, PortShape([8], [32]))
    generate(port, GenerationRequest.greedy([[2, 5, 7]], 3))
    inputs = port.inputs.decode(torch.tensor([5]), torch.tensor([9]))
    assert not any(t.is_inference() for t in inputs)
    want = port.inputs.decode_fresh(torch.tensor([5]), torch.tensor([9]))
    assert all(torch.equal(a, b) for a, b in zip(inputs, want, strict=True))
