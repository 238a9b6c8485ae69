"""Self-checks for silent wrongness: the things a new adapter gets wrong without any error.

Greedy tokens can agree with Hugging Face while the port is wrong: argmax does not see a missing
softcap, and random tiny weights often repeat one token. These checks look where tokens cannot:

* :func:`check_embeddings` — the host gather (word table, its scale, and per-layer inputs) equals
  the model's own embedding modules on a probe of token ids spread over the vocabulary;
* :func:`check_attention` — every layer of the graphs ran the library's attention function (a
  sentinel the function sets, not a config value that a module's own config copy could contradict);
* :func:`check_logits` — every step's logits, after the host softcap, equal Hugging Face's within
  :data:`LOGIT_TOLERANCE` of the largest reference logit.

Each returns a :class:`Check` that passes or fails with the fix; ``neuron-port port --check`` and
``neuron-port doctor`` run them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from neuron_port import attention
from neuron_port.embedding import HostEmbeddings
from neuron_port.families import family_of
from neuron_port.logits import softcap as apply_softcap
from neuron_port.shapes import PortShape

if TYPE_CHECKING:
    from neuron_port.ranks import RankSetup

LOGIT_TOLERANCE = 1e-3
"""Largest |port - reference| logit difference allowed, relative to the reference's largest |logit|."""
EMBEDDING_TOLERANCE = 1e-5
PROBE_TOKENS = 64


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "skip"
    detail: str
    fix: str = ""


def probe_ids(vocab_size: int, count: int = PROBE_TOKENS) -> torch.Tensor:
    """[1, count] token ids spread over the whole vocabulary (first and last included)."""
    return torch.linspace(0, vocab_size - 1, min(count, vocab_size)).round().long()[None, :]


def _differs(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The largest difference relative to the reference's scale, or None when they agree."""
    scale = want.abs().max().clamp_min(1e-12)
    err = float((got.double() - want.double()).abs().max() / scale)
    return err if err > EMBEDDING_TOLERANCE else None


@torch.no_grad()
def check_embeddings(model: nn.Module, embeddings: HostEmbeddings | None = None) -> Check:
    """The host embeddings (``embeddings``, default: gathered from ``model``) against the model's
    own embedding modules, word and per-layer."""
    family = family_of(model)
    embeddings = embeddings or HostEmbeddings.from_model(model)
    ids = probe_ids(embeddings.word.shape[0])
    host_words, host_per_layer = embeddings.embed(ids)
    problems = []
    word_err = _differs(host_words, family.word_embedding(model)(ids))
    if word_err is not None:
        ratio = float(family.word_embedding(model)(ids).abs().max() / host_words.abs().max().clamp_min(1e-12))
        problems.append(f"the word embedding differs from the model's own embedding module by {word_err:.3g} of its "
                        f"scale (the model's is {ratio:.4g}x the host's)")
    ple_module = family.per_layer_embedding(model)
    if ple_module is not None:
        ple_err = _differs(host_per_layer.flatten(-2), ple_module(ids))
        if ple_err is not None:
            problems.append(f"the per-layer inputs differ from the model's own by {ple_err:.3g} of their scale")
    if problems:
        return Check("embeddings", "fail", "; ".join(problems),
                     f"the {family.name} adapter's embedding_scales (and per-layer input hooks) must reproduce what "
                     "its embedding modules compute: a scaled embedding module needs its scale on the host too")
    return Check("embeddings", "pass", f"host gathers equal the model's embedding modules on {ids.shape[1]} probe ids")


@torch.no_grad()
def check_attention(model: nn.Module, setup: "RankSetup", shape: PortShape) -> Check:
    """Build every rank's graphs over its shard (in this process, all-reduce left out: only which
    function runs matters) and run the smallest prefill once, eagerly, recording which attention
    modules called the library's attention function."""
    from neuron_port.parallel import identity_reduce
    from neuron_port.port import Port
    from neuron_port.ranks import make_rank

    family = setup.layout.family
    missed: dict[int, list[int]] = {}
    layers, failure = 0, None
    for r in range(setup.tp):
        rank = make_rank(setup, r, identity_reduce, model)
        port = Port.for_rank(rank, PortShape(shape.buckets[:1], shape.kv_lens[:1], shape.ring_buffers))
        bucket = port.buckets[0]
        inputs, store = port.inputs.example_prefill(bucket, 1)
        with attention.recording() as seen:
            try:
                port.graphs.prefill[bucket](*inputs, *store)
            except Exception as exc:  # another attention function can fail on a rank's head counts
                failure = failure or f"{type(exc).__name__}: {exc}"
        modules = [family.attention(layer) for layer in family.decoder_layers(rank.model)]
        layers = len(modules)
        skipped = [i for i, module in enumerate(modules) if id(module) not in seen]
        if skipped:
            missed[r] = skipped
    if missed:
        where = "; ".join(f"rank {r}: layers {ls}" for r, ls in missed.items())
        stopped = f" (the run stopped at {failure})" if failure else ""
        return Check("attention", "fail",
                     f"{where} of {layers} ran another attention function than the library's ({attention.NAME}): "
                     f"a config their modules hold of their own still names another one{stopped}",
                     "set the implementation on every config copy: DecoderFamily.use_attention does it once the "
                     "adapter's set_attention_projections has made its copies; make no config copies after that")
    if failure:
        return Check("attention", "fail", f"every layer called {attention.NAME}, but the graphs failed: {failure}",
                     "run the port at tp 1 to see whether the failure is the adapter's or the sharding's")
    return Check("attention", "pass", f"all {layers} layers of {setup.tp} rank(s) ran {attention.NAME}")


def check_logits(port_logits: Sequence[torch.Tensor], reference_logits: Sequence[torch.Tensor], cap: float | None,
                 tolerance: float = LOGIT_TOLERANCE) -> tuple[Check, dict]:
    """Every step's raw port logits, softcapped on the host, against Hugging Face's (``[vocab]`` each)."""
    steps = min(len(port_logits), len(reference_logits))
    if steps == 0:
        return Check("logits", "skip", "no steps to compare"), {}
    ours = apply_softcap(torch.stack([torch.as_tensor(l).reshape(-1) for l in port_logits[:steps]]).double(), cap)
    theirs = torch.stack([torch.as_tensor(l).reshape(-1) for l in reference_logits[:steps]]).double()
    per_step = (ours - theirs).abs().amax(dim=-1) / theirs.abs().amax(dim=-1).clamp_min(1e-12)
    worst = int(per_step.argmax())
    report = {"steps": steps, "max_relative_error": float(per_step.max()), "worst_step": worst, "tolerance": tolerance}
    if float(per_step.max()) > tolerance:
        return Check("logits", "fail",
                     f"step {worst}: logits differ from Hugging Face's by {float(per_step.max()):.3g} of the largest "
                     f"(tolerance {tolerance:g}) even where tokens may agree",
                     "a missing or wrong final softcap (the adapter's softcap), scale, or norm; compare the "
                     "adapter's config facts with the model's forward"), report
    return Check("logits", "pass", f"{steps} steps within {tolerance:g} of the largest logit "
                                   f"(worst {float(per_step.max()):.2g})"), report


@torch.no_grad()
def check_step_logits(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int],
                      step_logits: Sequence[torch.Tensor]) -> tuple[Check, dict]:
    """The port's raw logits of every step (row 0 of each ``[batch, vocab]``) against Hugging Face's
    forward over the same prompt and the port's own tokens (teacher-forced: one forward, no drift
    after a divergence), each step after the adapter's softcap."""
    family = family_of(model)
    steps = min(len(tokens), len(step_logits))
    if steps == 0:
        return Check("logits", "skip", "no steps to compare"), {}
    ids = torch.tensor([list(prompt) + list(tokens[: steps - 1])])
    reference = model(ids).logits[0, len(prompt) - 1:].float()
    ours = [torch.as_tensor(step).reshape(-1, reference.shape[-1])[0] for step in step_logits[:steps]]
    return check_logits(ours, list(reference), family.softcap(family.text_config_of(model)))


def as_json(checks: Sequence[Check]) -> list[dict]:
    return [asdict(check) for check in checks]


__all__ = ["LOGIT_TOLERANCE", "Check", "probe_ids", "check_embeddings", "check_attention", "check_logits",
           "check_step_logits", "as_json"]
