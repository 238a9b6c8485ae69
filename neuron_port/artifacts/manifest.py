"""Artifact directories that say what they are and refuse to run where they would be wrong.

Layout::

    DIR/manifest.json            what follows, with a digest of every field
    DIR/config.json              the text config the graphs were built from
    DIR/embeddings.safetensors   host tables (word, per-layer)
    DIR/tokenizer.json           when the source had one
    DIR/rank{r}/weights.safetensors   (cpu) rank r's shard of the transformer, once for all its graphs
    DIR/rank{r}/graph_weights.json    (cpu) which of those tensors each graph takes, and their specs
    DIR/rank{r}/prefill_{bucket}.pt, decode_{kv_len}.pt   (cpu) compiled graphs, without the weights
    DIR/rank0/model.pt, weights/, nxd_graphs.json   (nxd, and neuron: nxd at tp 1) one ModelBuilder
                                      executor for every NeuronCore (:mod:`neuron_port.backends.nxd_artifact`)

The manifest records the library, backend and component versions, the config hash, a weights
fingerprint (tensor names, shapes, dtypes and contents), buckets, KV lengths, TP degree, KV
layout, and the SHA-256 of every file. :func:`verify` checks all of it and names the field,
what was expected and what was found. Directories are written under a temporary name and
renamed into place, so an interrupted write leaves nothing a loader accepts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from neuron_port.artifacts.record import Manifest
from neuron_port.backends.registry import backend_spec
from neuron_port.errors import ArtifactError, UnsupportedArchitectureError
from neuron_port.families import AdapterSource, adapter_source, family_for
from neuron_port.progress import progress

# 2: graphs without weights, one weights file per rank; 3: graphs take lengths and build their own masks
FORMAT = "neuron-port-artifact/4"
MANIFEST = "manifest.json"
NEURON_COMPONENTS = ("torch-neuronx", "neuronx-cc", "neuronx-distributed")


# ---- hashing -------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over sorted tensor names, shapes, dtypes and contents."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def config_hash(config_dict: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical(dict(config_dict))).hexdigest()


def installed_versions() -> dict[str, str | None]:
    """Versions of what an artifact depends on, read from package metadata (nothing imported)."""
    from neuron_port.versions import LIBRARY_VERSION as __version__

    out: dict[str, str | None] = {"neuron-port": __version__}
    for dist in ("torch", "transformers", *NEURON_COMPONENTS):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


# ---- writing -------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_directory(out_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``out_dir`` in one rename."""
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_manifest(directory: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Hash every file under ``directory``, add field digests, write ``manifest.json`` last."""
    paths = [p for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST]
    files = {str(p.relative_to(directory)): file_sha256(p) for p in progress(paths, desc="hashing files", unit="file")}
    manifest = {"format": FORMAT, **fields, "files": files}
    manifest["field_digests"] = {k: hashlib.sha256(_canonical(v)).hexdigest() for k, v in manifest.items()}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


# ---- reading and verifying -----------------------------------------------------------------
def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise ArtifactError(f"{directory} is not an artifact directory (it does not exist or is not a directory)")
    if not path.exists():
        raise ArtifactError(f"{directory} has no {MANIFEST}: not a complete artifact (an interrupted compile?)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path} does not parse: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(
            f"{path}: field 'format' expected {FORMAT!r}, "
            f"found {manifest.get('format') if isinstance(manifest, dict) else manifest!r}"
        )
    return manifest


def _check_digests(manifest: dict[str, Any]) -> None:
    digests = manifest.get("field_digests")
    if not isinstance(digests, dict):
        raise ArtifactError("manifest.json: field 'field_digests' is missing or not an object")
    fields = {k for k in manifest if k != "field_digests"}
    for name in sorted(fields | set(digests)):
        if name not in digests:
            raise ArtifactError(f"manifest.json: field {name!r} is not covered by field_digests (added by hand?)")
        if name not in manifest:
            raise ArtifactError(f"manifest.json: field {name!r} is missing")
        found = hashlib.sha256(_canonical(manifest[name])).hexdigest()
        if found != digests[name]:
            raise ArtifactError(
                f"manifest.json: field {name!r} was edited: expected digest {digests[name][:16]}…, "
                f"found {found[:16]}… for value {json.dumps(manifest[name])[:120]}"
            )


def _check_versions(manifest: dict[str, Any], allow_mismatch: bool) -> None:
    recorded = manifest["versions"]
    installed = installed_versions()
    checks = [("neuron-port", 2), ("torch", 2)]
    if backend_spec(manifest["backend"]).sdk_modules:
        checks += [(name, 3) for name in NEURON_COMPONENTS]
    for name, parts in checks:
        want, have = recorded.get(name), installed.get(name)
        same = want == have if want is None or have is None else want.split(".")[:parts] == have.split(".")[:parts]
        if not same and not allow_mismatch:
            raise ArtifactError(
                f"field versions.{name}: the artifact was built with {want}, this environment has {have}; "
                "a graph compiled for another runtime can mis-execute rather than fail. Rebuild the artifact, "
                "or pass --allow-version-mismatch to run it anyway"
            )


def _adapter_fix(recorded: AdapterSource, found: AdapterSource | None) -> str:
    """What to do when this environment resolves another adapter than the artifact's."""
    if recorded.distribution == "(registered in process)":
        module = recorded.adapter_class.split(":")[0]
        return f"import {module} and register its adapter before loading (or ship it as a plugin)"
    if recorded.distribution == "neuron-port" and found is not None:
        return (
            f"the plugin {found.requirement()} replaces the shipped adapter here: uninstall it "
            f"(pip uninstall {found.distribution}) or rebuild the artifact with it"
        )
    return f"install that plugin (pip install {recorded.requirement()})"


def _check_adapter(manifest: dict[str, Any], allow_mismatch: bool) -> None:
    """The adapter that built the artifact must be the one this environment resolves (a plugin
    artifact needs its plugin installed, at the version it was built with)."""
    if not manifest.get("adapter"):
        return  # written before adapters were recorded
    recorded = AdapterSource(**manifest["adapter"])
    built_by = f"{recorded.adapter_class} of {recorded.distribution} {recorded.version or ''}".rstrip()
    try:
        found = adapter_source(family_for(manifest["model_type"]))
    except UnsupportedArchitectureError:
        raise ArtifactError(
            f"field adapter: the artifact was built by the adapter {built_by} for model type "
            f"{manifest['model_type']!r}, which is not installed here; "
            f"{_adapter_fix(recorded, None)}"
        ) from None
    if (found.adapter_class, found.distribution) != (recorded.adapter_class, recorded.distribution):
        raise ArtifactError(
            f"field adapter: the artifact was built by {built_by}, this environment resolves model "
            f"type {manifest['model_type']!r} to {found.adapter_class} of {found.requirement()}; "
            f"{_adapter_fix(recorded, found)}"
        )
    if found.version != recorded.version and not allow_mismatch and found.distribution != "neuron-port":
        raise ArtifactError(
            f"field adapter: the artifact was built by {built_by}, this environment has "
            f"{found.requirement()}; an adapter of another version can shard or feed the graphs "
            "differently. Install the version it was built with, rebuild the artifact, or pass "
            "--allow-version-mismatch"
        )


def verify(directory: str | Path, allow_version_mismatch: bool = False) -> Manifest:
    """Every check a loader needs before trusting an artifact; returns the manifest, typed."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    _check_digests(manifest)
    _check_versions(manifest, allow_version_mismatch)
    _check_adapter(manifest, allow_version_mismatch)
    present = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST}
    for rel, digest in progress(sorted(manifest["files"].items()), desc="checking files", unit="file"):
        path = directory / rel
        if not path.exists():
            raise ArtifactError(f"file {rel} listed in the manifest is missing")
        found = file_sha256(path)
        if found != digest:
            raise ArtifactError(f"file {rel}: expected sha256 {digest}, found {found} (corrupt or modified)")
    extra = sorted(present - set(manifest["files"]))
    if extra:
        raise ArtifactError(f"files not listed in the manifest: {extra}")
    config = json.loads((directory / "config.json").read_text())
    if config_hash(config) != manifest["config_hash"]:
        raise ArtifactError(f"config.json: expected hash {manifest['config_hash']}, found {config_hash(config)}")
    return Manifest.from_json(manifest, str(directory / MANIFEST))


__all__ = [
    "FORMAT",
    "file_sha256",
    "weights_fingerprint",
    "config_hash",
    "installed_versions",
    "atomic_directory",
    "write_manifest",
    "read_manifest",
    "verify",
]
