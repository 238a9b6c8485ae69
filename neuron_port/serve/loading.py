"""What the server serves: a model name, a model directory or an artifact, loaded into an engine.

A model (a shipped name or a directory) goes through the same path as every command: its rank
(tp 1) is set up by :mod:`neuron_port.parallel.ranks` and builds its port over the model; ``slim``
compiles that port for the engine's batch and drops the Hugging Face model from the host. An
artifact is verified and its rank loads the compiled graphs and the host embeddings only; a
tp > 1 artifact's other ranks run in processes of their own, stepping with the engine
(:mod:`neuron_port.serve.lockstep`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_port.generation.chat import ChatFormat, chat_format, generation_eos_ids
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.tokenizer import load_tokenizer
from neuron_port.serve.engine import ADMISSIONS, Engine


@dataclass
class Served:
    """A loaded model: its engine, tokenizer, chat format and limits."""

    model_id: str
    engine: Engine
    tokenizer: Any
    vocab_size: int
    eos_ids: tuple[int, ...]
    max_prompt: int
    buckets: list[int]
    chat: ChatFormat
    kv_len: int = 0  # the longest a request can grow (prompt + new tokens)
    bos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        """Prompt ids of ``text``: the tokenizer's own encoding (special tokens as it adds them)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: send the prompt as a list of token ids")
        return self.tokenizer.encode(text).ids


def _artifact_port(path: Path) -> tuple[Port, Any, int, Any]:
    """Rank 0's port of an artifact, its config, its batch, and the follower ranks of a tp > 1 one."""
    from neuron_port.artifacts.manifest import verify
    from neuron_port.artifacts.reader import artifact_setup, load_rank_port
    from neuron_port.model.configs import load_config

    manifest = verify(path)
    config = load_config(path / "config.json")
    if manifest.host_ranks == 1:
        return load_rank_port(path, manifest, 0), config, manifest.batch, None
    from neuron_port.serve.lockstep import Lockstep

    family = artifact_setup(path, manifest).layout.family
    lockstep = Lockstep(path, manifest, manifest.batch, family.special_ids(config).pad or 0)
    return lockstep.port, config, manifest.batch, lockstep


def _model_port(target: str, tiny: bool, seed: int, shape: PortShape, slim: bool, max_batch: int,
                dtype: str = "fp32", quant: str = "none") -> tuple[Port, Any, int | None]:
    from neuron_port.backends import get_backend
    from neuron_port.families import family_of
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import model_from_name, parse_dtype
    from neuron_port.parallel.ranks import RankSetup, run_ranks

    model = model_from_name(target, tiny=tiny, seed=seed, dtype=parse_dtype(dtype), quant=quant)
    config = family_of(model).text_config_of(model)
    port = run_ranks(lambda rank: Port.for_rank(rank, shape), RankSetup.for_layout(describe(model), 1), model)[0]
    del model
    if not slim:
        return port, config, None
    port.compile(get_backend("cpu"), batch=max_batch)
    port.release_graphs()
    return port, config, max_batch


def _served_tokenizer(path: Path, tiny: bool, vocab_size: int):
    if path.is_dir():
        return load_tokenizer(path)
    if tiny:
        from neuron_port.model.localdir import build_tokenizer

        return build_tokenizer(vocab_size)
    return None


def load_served(target: str, tiny: bool = False, seed: int = 0, slim: bool = False, max_batch: int = 4,
                max_queue: int = 64, buckets: Sequence[int] = (32, 64, 128), kv_lens: Sequence[int] = (256, 512),
                batching: str = "continuous", dtype: str = "fp32", quant: str = "none", model_id: str | None = None
                ) -> Served:
    """A model name, model directory or artifact directory, ready to serve.

    Artifacts always run slim (compiled graphs + embeddings only). ``slim`` on a model compiles
    TorchScript graphs for ``max_batch`` rows and drops the Hugging Face model from the host.
    ``batching``: ``continuous`` (``max_batch`` slots; the default) or ``static``. ``dtype``
    (``fp32`` or ``bf16``) is a model's graphs, weights and KV store, ``quant`` (``none``, ``int8`` or
    ``int8+head``: :data:`~neuron_port.model.quant.QUANT_SCHEMES`) its weights; an artifact keeps its own.
    ``model_id``: the name clients give in ``model`` (default: the directory's name, or the shipped name).
    """
    if batching not in ADMISSIONS:
        raise ValueError(f"batching must be one of {ADMISSIONS}, found {batching!r}")
    path = Path(target)
    lockstep = None
    if (path / "manifest.json").exists():
        port, config, fixed, lockstep = _artifact_port(path)
    else:
        port, config, fixed = _model_port(target, tiny, seed, PortShape(buckets, kv_lens), slim, max_batch, dtype, quant)
    family = port.layout.family
    special = family.special_ids(config)
    tokenizer = _served_tokenizer(path, tiny, port.layout.vocab_size)
    engine = Engine(port, tokenizer, slots=fixed or max_batch, max_queue=max_queue, pad_id=special.pad or 0,
                    lockstep=lockstep, admission=batching)
    name = model_id or (path.name if path.is_dir() else target)
    eos = tuple(dict.fromkeys((*special.eos, *generation_eos_ids(path if path.is_dir() else None, family))))
    return Served(name, engine, tokenizer, family.vocab_size(config), eos,
                  max(port.buckets), port.buckets, chat_format(family, tokenizer, path if path.is_dir() else None),
                  port.kv_len, special.bos)


__all__ = ["Served", "load_served"]
