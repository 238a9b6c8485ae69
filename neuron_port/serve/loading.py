"""What the server serves: a model name, a model directory or an artifact, loaded into an engine.

A model (a shipped name or a directory) goes through the same path as every command: its rank
(tp 1) is set up by :mod:`neuron_port.parallel.ranks` and builds its port over the model; ``slim``
compiles that port for the engine's batch and drops the Hugging Face model from the host. An
artifact is verified and its rank loads the compiled graphs and the host embeddings only; a
tp > 1 artifact's other ranks run in processes of their own, stepping with the engine
(:mod:`neuron_port.serve.lockstep`).

Speculative decoding (``speculate``: ``ngram`` or ``assistant``): a model built here gets verify graphs for
``draft_tokens`` drafts (compiled with the rest when ``slim``) and, for ``assistant`` (eager graphs only), returns
its hidden states to a Gemma-4 drafter (``draft``: its directory; a tiny random one for a ``tiny`` model) reading
the port's store; an artifact (tp 1) brings its own verify graphs (``compile --draft-tokens``), for ``ngram``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_port.errors import NeuronPortError
from neuron_port.generation.chat import ChatFormat, chat_format
from neuron_port.generation.opened import OpenedModel
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.serve.engine import ADMISSIONS, Engine

if TYPE_CHECKING:
    from neuron_port.generation.drafting import ModelDrafter

SPECULATION_METHODS = ("ngram", "assistant")


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
    speculation: str | None = None  # e.g. "ngram, 4 drafts per step"; None: plain decode steps

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
                dtype: str = "fp32", quant: str = "none", drafter_model: Any = None
                ) -> tuple[Port, int | None, ModelDrafter | None]:
    """The model's tp 1 port (compiled for ``max_batch`` rows when ``slim``), its fixed batch, and the drafter
    over it when ``drafter_model`` is given."""
    from neuron_port.backends import get_backend
    from neuron_port.families import family_of
    from neuron_port.generation.drafting import drafter_over_port
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import model_from_name, parse_dtype
    from neuron_port.parallel.ranks import RankSetup, run_ranks

    model = model_from_name(opened.source, tiny=opened.tiny, seed=seed, dtype=parse_dtype(dtype), quant=quant,
                            config=opened.config)
    hidden = drafter_model is not None
    port = run_ranks(lambda rank: Port.for_rank(rank, shape, returns_hidden=hidden),
                     RankSetup.for_layout(describe(model), 1), model)[0]
    drafter = drafter_over_port(drafter_model, family_of(model).text_config_of(model), port) if hidden else None
    del model
    if not slim:
        return port, None, drafter
    port.compile(get_backend("cpu"), batch=max_batch)
    port.release_graphs()
    return port, max_batch, None


def check_speculation(speculate: str | None, draft: str | None, draft_tokens: int, tiny: bool = False,
                      slim: bool = False, artifact_drafts: int | None = None) -> None:
    """Refuse, in one line each, speculation the server cannot run (before anything loads). ``artifact_drafts``:
    serving an artifact, the drafted tokens its verify graphs take (``compile --draft-tokens``); None for a model."""
    if speculate not in (None, *SPECULATION_METHODS):
        raise NeuronPortError(f"speculate must be one of {SPECULATION_METHODS} or None, found {speculate!r}")
    if draft is not None and speculate != "assistant":
        raise NeuronPortError(f"--draft names the drafter of --speculate assistant, found "
                              f"{f'--speculate {speculate}' if speculate else 'no --speculate'}")
    if speculate is None:
        return
    if draft_tokens < 1:
        raise NeuronPortError(f"--draft-tokens is 1 or more with --speculate, found {draft_tokens}")
    if speculate == "assistant" and draft is None and not tiny:
        raise NeuronPortError("--speculate assistant needs the drafter's directory: --draft DIR (a random one only "
                              "with --tiny)")
    if artifact_drafts is not None and speculate == "assistant":
        raise NeuronPortError("--speculate assistant runs the drafter over a model's eager graphs: serve the model "
                              "directory, or --speculate ngram on an artifact compiled with --draft-tokens")
    if artifact_drafts is not None and artifact_drafts < draft_tokens:
        raise NeuronPortError(f"--speculate with --draft-tokens {draft_tokens} needs verify graphs for {draft_tokens} "
                              f"drafts; the artifact has them for {artifact_drafts}: compile it with --draft-tokens "
                              f"{draft_tokens}, or pass --draft-tokens {artifact_drafts}" if artifact_drafts else
                              "--speculate needs verify graphs, which this artifact does not hold: compile it with "
                              "--draft-tokens K")
    if slim and speculate == "assistant":
        raise NeuronPortError("--speculate assistant runs the drafter over eager graphs: serve without --slim "
                              "(or --speculate ngram with --slim)")


def _served_tokenizer(opened: OpenedModel) -> Any:
    """The model's tokenizer; a tiny random model's a word-level one over its vocabulary (so it takes text)."""
    if opened.directory is not None or not opened.tiny:
        return opened.tokenizer
    from neuron_port.model.localdir import build_tokenizer

    return build_tokenizer(opened.vocab_size)


def load_served(target: str, tiny: bool = False, seed: int = 0, slim: bool = False, max_batch: int = 4,
                max_queue: int = 64, buckets: Sequence[int] = (32, 64, 128), kv_lens: Sequence[int] = (256, 512),
                batching: str = "continuous", dtype: str = "fp32", quant: str = "none", model_id: str | None = None,
                speculate: str | None = None, draft_tokens: int = 4, draft: str | None = None) -> Served:
    """A model name, model directory or artifact directory, ready to serve.

    Artifacts always run slim (compiled graphs + embeddings only). ``slim`` on a model compiles
    TorchScript graphs for ``max_batch`` rows and drops the Hugging Face model from the host.
    ``batching``: ``continuous`` (``max_batch`` slots; the default) or ``static``. ``dtype``
    (``fp32`` or ``bf16``) is a model's graphs, weights and KV store, ``quant`` (``none``, ``int8`` or
    ``int8+head``: :data:`~neuron_port.model.quant.QUANT_SCHEMES`) its weights; an artifact keeps its own.
    ``model_id``: the name clients give in ``model`` (default: the directory's name, or the shipped name).
    ``speculate`` (``ngram``, or ``assistant`` on a model without ``slim``): every step verifies up to ``draft_tokens``
    drafts per slot, by prompt lookup or by the Gemma-4 drafter in ``draft`` (a tiny random one for ``tiny``).
    """
    if batching not in ADMISSIONS:
        raise ValueError(f"batching must be one of {ADMISSIONS}, found {batching!r}")
    check_speculation(speculate, draft, draft_tokens, tiny, slim)
    opened = OpenedModel.open(target, tiny=tiny)
    check_speculation(speculate, draft, draft_tokens, tiny, slim, artifact_drafts(target) if opened.artifact else None)
    k = draft_tokens if speculate else 0
    lockstep, drafter = None, None
    if opened.artifact:
        port, fixed, lockstep = _artifact_port(opened)
    else:
        drafter_model = _drafter_model(speculate, draft, opened, seed)  # checked against the target before it is built
        port, fixed, drafter = _model_port(opened, seed, PortShape(buckets, kv_lens, draft_tokens=k), slim, max_batch,
                                           dtype, quant, drafter_model)
    tokenizer = _served_tokenizer(opened)
    engine = Engine(port, tokenizer, slots=fixed or max_batch, max_queue=max_queue, pad_id=opened.special.pad or 0,
                    lockstep=lockstep, admission=batching, draft_tokens=k, drafter=drafter)
    name = model_id or (opened.directory.name if opened.directory is not None else target)
    chat = opened.chat if tokenizer is opened.tokenizer else chat_format(opened.family, tokenizer, opened.directory)
    speculation = f"{speculate}, up to {k} drafts per step" if speculate else None
    return Served(name, engine, tokenizer, opened.vocab_size, opened.eos_ids, max(port.buckets), port.buckets, chat,
                  port.kv_len, opened.special.bos, speculation)


def artifact_drafts(directory: str | Path) -> int:
    """The drafted tokens an artifact's verify graphs take (0: it has none), read from its manifest."""
    from neuron_port.artifacts.manifest import read_manifest

    return int(read_manifest(directory).get("draft_tokens", 0))


def _drafter_model(speculate: str | None, draft: str | None, opened: OpenedModel, seed: int) -> Any:
    """The Gemma-4 drafter of ``speculate="assistant"``: loaded from ``draft`` and checked against the target's
    config, or a tiny random one; None for any other speculation."""
    if speculate != "assistant":
        return None
    from neuron_port.model.drafter import build_drafter, load_drafter

    return load_drafter(draft, opened.config) if draft is not None else build_drafter(opened.config, seed=seed + 1)


__all__ = ["Served", "load_served", "check_speculation", "artifact_drafts", "SPECULATION_METHODS"]
