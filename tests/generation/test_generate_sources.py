"""generate gives the same tokens from a model, a port and an artifact."""


from __future__ import annotations

import pytest

from neuron_port import describe, load_config
from neuron_port.artifacts.writer import write_artifact
from neuron_port.checks.oracle import reference_generate
from neuron_port.errors import BucketError
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.source import Source
from neuron_port.parallel.ranks import RankSetup

PROMPT = [2, 17, 33, 5, 92, 41, 7, 300, 12, 58, 9, 77, 140, 3, 64, 211, 18, 25]


# ---- one generate entry point ----------------------------------------------------------------
def test_generate_gives_the_same_tokens_from_a_model_a_port_and_an_artifact(tiny_e2b, tmp_path):
    shape = PortShape(32, 64)
    want = reference_generate(tiny_e2b, PROMPT, 12).tokens
    from_model = generate(tiny_e2b, GenerationRequest.greedy([PROMPT], 12), shape=shape)
    from_port = generate(Port.over_model(tiny_e2b, PortShape([32], [64])), GenerationRequest.greedy([PROMPT], 12))
    write_artifact(
        tmp_path / "art",
        tiny_e2b,
        Source.shipped("gemma-4-e2b", tiny=True),
        RankSetup.for_layout(describe(tiny_e2b), 1),
        shape,
    )
    from_artifact = generate(tmp_path / "art", GenerationRequest.greedy([PROMPT], 12))
    assert from_model.tokens[0] == from_port.tokens[0] == from_artifact.tokens[0] == want
    assert from_model.per_rank_kv_cache_bytes == from_artifact.per_rank_kv_cache_bytes
    with pytest.raises(ValueError, match="disagrees"):
        generate(tiny_e2b, GenerationRequest.greedy([PROMPT], 4), setup=RankSetup.for_layout(describe(tiny_e2b), 1), tp=2)
    with pytest.raises(ValueError, match="planned for another layout"):
        generate(
            tiny_e2b,
            GenerationRequest.greedy([PROMPT], 4),
            setup=RankSetup.for_layout(describe(load_config("gemma-4-12b", tiny=True)), 1),
        )
    with pytest.raises(ValueError, match="brings its own"):
        generate(tmp_path / "art", GenerationRequest.greedy([PROMPT], 4), shape=shape)
    with pytest.raises(BucketError, match="longer than the largest prompt bucket"):
        generate(tmp_path / "art", GenerationRequest.greedy([list(range(40))], 4))
