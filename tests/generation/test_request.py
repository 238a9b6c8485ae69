"""Generation requests and results: what a request refuses, and a result crossing a process whole."""


import json

import pytest
import torch

from neuron_port.generation.request import GenerationParams, GenerationRequest, GenerationResult


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


def test_a_speculative_request_is_refused_what_it_cannot_keep():
    assert GenerationRequest.greedy([[2, 3]], 4, draft_tokens=3).without_logits().draft_tokens == 3
    with pytest.raises(ValueError, match="0 \\(no speculation\\) or more, found -1"):
        GenerationRequest([[2]], draft_tokens=-1)
    with pytest.raises(ValueError, match="verify steps keep none yet"):
        GenerationRequest.greedy([[2]], 4, keep_logits=True, draft_tokens=2)


def test_decode_rate_counts_tokens_so_a_verify_step_counts_every_token_it_makes():
    plain = GenerationResult([[5, 6, 7, 8]], [""], ["length"], decode_s=1.5, decode_steps=3)
    spec = GenerationResult([[5, 6, 7, 8]], [""], ["length"], decode_s=1.5, decode_steps=1)  # one step, three tokens
    assert plain.decode_tok_per_s == spec.decode_tok_per_s == 2.0
