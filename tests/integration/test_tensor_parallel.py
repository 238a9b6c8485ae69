"""Ranks against Hugging Face: the sharded Gemma-4 sizes as threads and as gloo processes."""


import pytest

from neuron_port import load_config
from neuron_port.model.loading import build_model
from tests.helpers import ranks_match_hf


@pytest.mark.slow
@pytest.mark.parametrize("name,tp,in_process", [("gemma-4-e4b", 2, False), ("gemma-4-12b", 2, False), ("gemma-4-12b", 4, True)])
def test_ranks_match_hugging_face(name, tp, in_process):
    """gloo processes at tp 2; tp 4 as threads (four spawned interpreters cost ~20 s on two cores, and the
    process path is the same code at any tp)."""
    model = build_model(load_config(name, tiny=True), seed=0)
    got = ranks_match_hf(model, tp, in_process=in_process)
    assert len(got.per_rank_kv_cache_bytes) == tp
    assert not got.rank_disagreement
