"""Models named by a Hugging Face id, resolved through ``huggingface_hub`` against a hub cache laid out on disk
(no network: offline mode, as CI and an air-gapped inf2 host run)."""

from __future__ import annotations

import pytest

from neuron_port.errors import ModelSourceError
from neuron_port.model import hub
from tests.helpers import hub_cache


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty hub cache with downloads off (what HF_HUB_CACHE and HF_HUB_OFFLINE=1 set in a fresh process)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.mark.parametrize("name,expected", [("google/gemma-4-E2B-it", True), ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
                                           ("gemma-4-e2b", False), ("qwen2", False), ("a/b/c", False), ("/abs/x", False),
                                           ("owner/", False), ("./local", False)])
def test_what_reads_as_a_hub_id(name, expected):
    assert hub.is_hub_id(name) is expected


def test_an_existing_local_path_is_never_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not hub.is_hub_id("org/model") and hub.resolve_model("org/model") == "org/model"


def test_a_cached_id_resolves_to_its_snapshot_offline(offline_cache, tmp_path):
    source = tmp_path / "weights"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"x")
    snapshot = hub_cache(offline_cache, "org/model", source)
    assert hub.resolve_model("org/model") == str(snapshot)
    assert (snapshot / "config.json").read_text() == "{}"


def test_a_revision_picks_its_own_snapshot(offline_cache, tmp_path):
    source = tmp_path / "weights"
    source.mkdir()
    (source / "config.json").write_text("{}")
    main = hub_cache(offline_cache, "org/model", source)
    tagged = hub_cache(offline_cache, "org/model", source, revision="v1", commit="1" * 40)
    assert hub.resolve_model("org/model") == str(main)
    assert hub.resolve_model("org/model", revision="v1") == str(tagged) != str(main)


def test_an_uncached_id_offline_is_one_line_naming_the_cache_and_the_fix(offline_cache):
    with pytest.raises(ModelSourceError) as err:
        hub.resolve_model("org/absent")
    message = str(err.value)
    assert "HF_HUB_OFFLINE=1" in message and str(offline_cache) in message and "hf download org/absent" in message
    assert "\n" not in message


def test_a_revision_on_anything_but_a_hub_id_is_refused():
    with pytest.raises(ModelSourceError, match="applies to a Hugging Face model id"):
        hub.resolve_model("gemma-4-e2b", revision="v1")
    assert hub.resolve_model("gemma-4-e2b") == "gemma-4-e2b"
