"""Verified artifacts in one process: what the manifest names, tamper detection, atomic writes, version gates."""


import json

import pytest
import torch

from neuron_port import load_config
from neuron_port.artifacts import manifest as artifact
from neuron_port.model.loading import build_model
from neuron_port.model.source import Source
from tests.helpers import copy_tree, run_cli, write_tiny_artifact


def _module_paths_in(directory):
    """Every dotted ``neuron_port`` path an artifact's loader could import: in the manifest, the rank
    JSON files and the saved graphs' code (TorchScript's ``*.debug_pkl`` only holds source lines for
    tracebacks and is never imported). Families paths (``neuron_port.families.<f>:<Class>``) are kept
    where they are on purpose, so they are not listed."""
    import re
    import zipfile

    pattern = re.compile(rb"neuron_port(?:\.\w+)+(?::\w+)?")
    found = set()
    for path in sorted(directory.rglob("*")):
        if path.suffix == ".json":
            found |= set(pattern.findall(path.read_bytes()))
        elif path.suffix == ".pt":
            with zipfile.ZipFile(path) as archive:
                for name in archive.namelist():
                    if not name.endswith(".debug_pkl"):
                        found |= set(pattern.findall(archive.read(name)))
    return sorted(p.decode() for p in found if not p.startswith(b"neuron_port.families."))


def test_an_artifact_names_no_module_a_tree_move_can_break(tiny_e2b_artifact, tmp_path):
    """An artifact written before the package moved into layer folders still loads after it: nothing
    it records names a module path other than a family adapter's (which never move). The fresh-process
    check above loads and runs one; this keeps what it depends on true, and the scan finds a planted path."""
    manifest = json.loads((tiny_e2b_artifact / "manifest.json").read_text())
    assert manifest["adapter"]["adapter_class"] == "neuron_port.families.gemma4:Gemma4Family"
    assert _module_paths_in(tiny_e2b_artifact) == []
    planted = copy_tree(tiny_e2b_artifact, tmp_path)
    (planted / "rank0" / "graph_weights.json").write_text(json.dumps({"runner": "neuron_port.graph.runners:Runners"}))
    assert _module_paths_in(planted) == ["neuron_port.graph.runners:Runners"]


@pytest.mark.parametrize("field,value", [("buckets", [16]), ("tp", 2), ("kv_lens", [128]), ("backend", "neuron"),
                                         ("weights_fingerprint", "0" * 64), ("source", {"kind": "dir", "path": "/x"})])
def test_editing_any_manifest_field_is_refused_by_name(tiny_e2b_artifact, tmp_path, field, value):
    art = copy_tree(tiny_e2b_artifact, tmp_path)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest[field] = value
    (art / "manifest.json").write_text(json.dumps(manifest))
    res = run_cli("generate", str(art), "--max-new-tokens", "2")
    assert res.returncode != 0 and res.stdout == ""
    assert f"field {field!r} was edited" in res.stderr


def test_flipping_one_byte_of_a_weights_file_is_refused(tiny_e2b_artifact, tmp_path):
    art = copy_tree(tiny_e2b_artifact, tmp_path)
    for rel in ("rank0/weights.safetensors", "embeddings.safetensors", "rank0/decode_64.pt"):
        path = art / rel
        original = path.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        res = run_cli("generate", str(art), "--max-new-tokens", "2")
        assert res.returncode != 0 and f"file {rel}: expected sha256" in res.stderr
        path.write_bytes(original)
    assert run_cli("generate", str(art), "--max-new-tokens", "2").returncode == 0


def test_interrupted_compile_leaves_nothing_generate_accepts(tmp_path, monkeypatch):
    import neuron_port.artifacts.writer as writer

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("simulated interruption")

    monkeypatch.setattr(writer, "compile_rank", boom)  # the host files are written, no rank finishes
    out = tmp_path / "half"
    with pytest.raises(KeyboardInterrupt):
        write_tiny_artifact(build_model(load_config("gemma-4-e2b", tiny=True)), out, Source.shipped("gemma-4-e2b", tiny=True))
    assert not out.exists() and list(tmp_path.iterdir()) == []
    res = run_cli("generate", str(out))
    assert res.returncode != 0 and "not an artifact directory" in res.stderr


def test_version_mismatch_is_refused_unless_overridden(tmp_path, monkeypatch):
    real = artifact.installed_versions()
    monkeypatch.setattr("neuron_port.artifacts.writer.installed_versions", lambda: {**real, "torch": "1.0.0"})
    out = tmp_path / "old"
    write_tiny_artifact(
        build_model(load_config("gemma-4-e2b", tiny=True)),
        out,
        Source.shipped("gemma-4-e2b", tiny=True),
    )
    res = run_cli("generate", str(out), "--max-new-tokens", "2")
    assert res.returncode != 0 and "versions.torch" in res.stderr and "1.0.0" in res.stderr
    assert run_cli("generate", str(out), "--max-new-tokens", "2", "--allow-version-mismatch").returncode == 0


def test_check_refuses_a_reference_with_other_weights(tmp_path):
    out = tmp_path / "wrong_source"
    write_tiny_artifact(
        build_model(load_config("gemma-4-e2b", tiny=True), seed=1),
        out,
        Source.shipped("gemma-4-e2b", tiny=True),
    )
    res = run_cli("generate", str(out), "--max-new-tokens", "4", "--check", "--json")
    assert res.returncode != 0 and "not the artifact's checkpoint" in res.stderr
    assert "seq_match" not in res.stdout


@pytest.mark.slow
def test_a_bf16_artifact_is_checked_against_the_float32_reference(tmp_path):
    """compile --dtype bf16 of a model directory: bf16 files, and generate --check compares with the
    float32 from_pretrained reference (proven the same checkpoint by the fingerprint of its bf16
    cast) within the measured bf16 bound; an artifact of another dtype is refused by --dtype."""
    from safetensors import safe_open

    from neuron_port.checks.selfcheck import REDUCED_PRECISION_LOGIT_TOLERANCE
    from neuron_port.model.loading import build_model
    from neuron_port.model.localdir import write_model_dir

    model_dir, out = tmp_path / "model", tmp_path / "artifact"
    write_model_dir(build_model(load_config("gemma-3", tiny=True), seed=2), model_dir)
    res = run_cli("compile", str(model_dir), "--dtype", "bf16", "--buckets", "16", "--kv-lens", "32", "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["dtype"] == "torch.bfloat16"
    with safe_open(str(out / "embeddings.safetensors"), framework="pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.bfloat16}
    checked = json.loads(run_cli("generate", str(out), "--prompt-len", "8", "--max-new-tokens", "6", "--check", "--json").stdout)
    assert checked["self_checks_passed"] is True and checked["dtype"] == "torch.bfloat16"
    assert checked["logit_check"]["tolerance"] == REDUCED_PRECISION_LOGIT_TOLERANCE
    refused = run_cli("generate", str(out), "--dtype", "fp32", "--prompt-len", "8", "--max-new-tokens", "2")
    assert refused.returncode != 0 and "compiled in torch.bfloat16" in refused.stderr
