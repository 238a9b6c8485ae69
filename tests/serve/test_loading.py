"""What the server serves, loaded in process: a tiny model compiled slim for the engine's batch,
its limits and special ids, and a bad batching policy refused before anything loads."""

import pytest

from neuron_port.serve.loading import Served, load_served


def test_a_slim_tiny_model_is_compiled_for_the_engines_batch():
    served = load_served("gemma-4-e2b", tiny=True, slim=True, max_batch=2, buckets=(16, 32), kv_lens=(64, 128))
    try:
        assert isinstance(served, Served) and served.model_id == "gemma-4-e2b"
        assert served.engine.max_batch == 2 and served.engine.batch.port.batch == 2  # compiled for 2 rows
        assert served.engine.batch.port.graphs is None  # the graphs, and the model they ran, dropped
        assert (served.max_prompt, served.buckets, served.kv_len) == (32, [16, 32], 128)
        assert served.bos_id == 2 and 1 in served.eos_ids and served.vocab_size == 512
        ids = served.encode("hello")
        assert ids and all(0 <= i < 512 for i in ids)
    finally:
        served.engine.close()


def test_an_unknown_batching_policy_is_refused_first():
    with pytest.raises(ValueError, match="batching must be one of .*'continuous'.*found 'greedy'"):
        load_served("no-such-model", batching="greedy")


def test_a_served_int8_model_decodes_what_the_int8_model_computes():
    """``serve --quant int8``: the engine's graphs run int8 projections, and a greedy request gives Hugging
    Face's tokens for the same quantized model."""
    from neuron_port.checks.oracle import reference_generate
    from neuron_port.generation.generate import generate
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.model.loading import model_from_name
    from neuron_port.model.quant import Int8Linear

    served = load_served("gemma-4-e2b", tiny=True, quant="int8", max_batch=2, buckets=(32,), kv_lens=(64,))
    try:
        port = served.engine.batch.port
        graph = next(iter(port.graphs.decode.values()))
        assert sum(isinstance(m, Int8Linear) for m in graph.model.modules()) > 0
        prompt = [2] + list(range(40, 60))
        got = generate(port, GenerationRequest.greedy([prompt], 12))
        want = reference_generate(model_from_name("gemma-4-e2b", tiny=True, quant="int8"), prompt, 12).tokens
        assert got.tokens[0] == want
    finally:
        served.engine.close()
