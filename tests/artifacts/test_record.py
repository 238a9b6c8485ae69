"""An artifact's manifest as a typed record: what verify returns and every reader takes."""

import json
import pickle

import pytest
import torch

from neuron_port.artifacts.manifest import verify
from neuron_port.artifacts.record import Manifest
from neuron_port.errors import ArtifactError
from neuron_port.graph.shapes import PortShape
from neuron_port.model.source import Source


def _json(artifact) -> dict:
    return json.loads((artifact / "manifest.json").read_text())


def test_verify_returns_the_typed_record_of_the_json_it_checked(tiny_e2b_artifact):
    manifest, raw = verify(tiny_e2b_artifact), _json(tiny_e2b_artifact)
    assert isinstance(manifest, Manifest) and manifest == Manifest.from_json(raw)
    assert manifest.dtype is torch.float32 and raw["dtype"] == str(manifest.dtype)  # typed, spelled as torch does
    assert manifest.shape == PortShape([32], [64]) and manifest.batch == 1 and manifest.tp == 1
    assert manifest.source == Source.shipped("gemma-4-e2b", tiny=True) and manifest.runners["kv_write"] == "in_place"
    assert manifest.files == raw["files"] and manifest.host_ranks == 1
    assert pickle.loads(pickle.dumps(manifest)) == manifest  # a tp > 1 server hands it to its rank processes


def test_the_summary_is_what_compile_prints(tiny_e2b_artifact):
    summary = verify(tiny_e2b_artifact).summary()
    assert summary == {"backend": "cpu", "tp": 1, "buckets": [32], "kv_lens": [64], "batch": 1, "dtype": "torch.float32",
                       "weights_fingerprint": _json(tiny_e2b_artifact)["weights_fingerprint"], "quant": "none",
                       "files": len(_json(tiny_e2b_artifact)["files"])}


def test_one_process_drives_every_core_of_an_nxd_artifact(tiny_e2b_artifact):
    raw = _json(tiny_e2b_artifact)
    assert Manifest.from_json({**raw, "tp": 2}).host_ranks == 2
    assert Manifest.from_json({**raw, "tp": 2, "backend": "nxd"}).host_ranks == 1


@pytest.mark.parametrize("edit,message", [
    (lambda raw: raw.pop("batch"), "field 'batch' is missing"),
    (lambda raw: raw.update(dtype="float16"), "dtype must be one of"),
    (lambda raw: raw.update(source={"kind": "dir"}), "field source: expected"),
    (lambda raw: raw.update(buckets=[128], kv_lens=[64]), "at most the largest KV length"),
])
def test_a_field_missing_or_of_the_wrong_kind_is_named(tiny_e2b_artifact, edit, message):
    raw = _json(tiny_e2b_artifact)
    edit(raw)
    with pytest.raises(ArtifactError, match=message):
        Manifest.from_json(raw)
