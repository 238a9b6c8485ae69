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
