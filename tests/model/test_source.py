"""The record of where a model's weights came from, and its manifest JSON."""

import pickle

import pytest

from neuron_port.errors import ModelSourceError
from neuron_port.model.source import Source


@pytest.mark.parametrize("source", [Source.shipped("gemma-4-e2b", tiny=True, seed=3, quant="int8"),
                                    Source.directory("/models/smollm2")])
def test_a_source_round_trips_through_its_json_and_a_pickle(source):
    assert Source.from_json(source.to_json()) == source == pickle.loads(pickle.dumps(source))


def test_the_json_is_the_manifests_two_shapes():
    assert Source.shipped("gemma-4-e2b", True).to_json() == {"kind": "shipped", "name": "gemma-4-e2b", "tiny": True,
                                                             "seed": 0, "quant": "none"}
    assert Source.directory("/m", "int8+head").to_json() == {"kind": "dir", "path": "/m", "quant": "int8+head"}
    assert Source.directory("/m").is_checkpoint and not Source.shipped("gemma-4-e2b").is_checkpoint


@pytest.mark.parametrize("record", [{"kind": "shipped"}, {"kind": "dir", "name": "x"}, {"kind": "hub", "path": "x"},
                                    {}, ["dir", "/m"]])
def test_a_record_of_neither_shape_is_refused_with_both_shapes_named(record):
    with pytest.raises(ModelSourceError, match=r"expected \{'kind': 'shipped', 'name': \.\.\.\} or \{'kind': 'dir'"):
        Source.from_json(record)


def test_a_source_must_be_one_kind_or_the_other():
    with pytest.raises(ModelSourceError, match="kind is one of"):
        Source("hub", name="x")
    with pytest.raises(ModelSourceError, match="a shipped source names a config"):
        Source("shipped", path="/m")
