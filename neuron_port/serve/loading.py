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
from typing import Any

from neuron_port.generation.chat import ChatFormat, chat_format
from neuron_port.generation.opened import OpenedModel
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
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


def _artifact_port(opened: OpenedModel) -> tuple[Port, int, Any]:
    """Rank 0's port of an artifact, its batch, and the follower ranks of a tp > 1 one."""
    from neuron_port.artifacts.manifest import verify
    from neuron_port.artifacts.reader import load_rank_port

    manifest = verify(opened.directory)
    if manifest.host_ranks == 1:
        return load_rank_port(opened.directory, manifest, 0), manifest.batch, None
    from neuron_port.serve.lockstep import Lockstep

    lockstep = Lockstep(opened.directory, manifest, manifest.batch, opened.special.pad or 0)
    return lockstep.port, manifest.batch, lockstep


def _model_port(opened: OpenedModel, seed: int, shape: PortShape, slim: bool, max_batch: int,
                dtype: str = "fp32", quant: str = "none") -> tuple[Port, int | None]:
    from neuron_port.backends import get_backend
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import model_from_name, parse_dtype
    from neuron_port.parallel.ranks import RankSetup, run_ranks

    model = model_from_name(opened.source, tiny=opened.tiny, seed=seed, dtype=parse_dtype(dtype), quant=quant,
                            config=opened.config)
    port = run_ranks(lambda rank: Port.for_rank(rank, shape), RankSetup.for_layout(describe(model), 1), model)[0]
    del model
    if not slim:
        return port, None
    port.compile(get_backend("cpu"), batch=max_batch)
    port.release_graphs()
    return port, max_batch


def _served_tokenizer(opened: OpenedModel) -> Any:
    """The model's tokenizer; a tiny random model's a word-level one over its vocabulary (so it takes text)."""
    if opened.directory is not None or not opened.tiny:
        return opened.tokenizer
    from neuron_port.model.localdir import build_tokenizer

    return build_tokenizer(opened.vocab_size)


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
    opened = OpenedModel.open(target, tiny=tiny)
    lockstep = None
    if opened.artifact:
        port, fixed, lockstep = _artifact_port(opened)
    else:
        port, fixed = _model_port(opened, seed, PortShape(buckets, kv_lens), slim, max_batch, dtype, quant)
    tokenizer = _served_tokenizer(opened)
    engine = Engine(port, tokenizer, slots=fixed or max_batch, max_queue=max_queue, pad_id=opened.special.pad or 0,
                    lockstep=lockstep, admission=batching)
    name = model_id or (opened.directory.name if opened.directory is not None else target)
    chat = opened.chat if tokenizer is opened.tokenizer else chat_format(opened.family, tokenizer, opened.directory)
    return Served(name, engine, tokenizer, opened.vocab_size, opened.eos_ids, max(port.buckets), port.buckets, chat,
                  port.kv_len, opened.special.bos)


__all__ = ["Served", "load_served"]
