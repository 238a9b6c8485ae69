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

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from neuron_port.backends.registry import backend_spec
from neuron_port.checks.check import Check
from neuron_port.checks.checked_run import LogitReport
from neuron_port.checks.oracle import teacher_forced_logits
from neuron_port.families import family_of
from neuron_port.generation.logits import softcap as apply_softcap
from neuron_port.graph import attention
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.shapes import PortShape

if TYPE_CHECKING:
    from neuron_port.parallel.ranks import RankSetup

LOGIT_TOLERANCE = 1e-3
"""Largest |port - reference| logit difference allowed, relative to the reference's largest |logit|."""
REDUCED_PRECISION_LOGIT_TOLERANCE = 0.15
"""The bound for graphs that may compute in bf16 (bf16 weights, a Neuron backend's auto-cast), measured
by benchmarks/bf16_accuracy.py: over 1,536 steps of 24 real-text prompts on SmolLM2-135M and Gemma-3
270M the bf16 CPU port's largest error was 0.101 (p99 0.035 and 0.022, the same as transformers' own
bf16 model); this is that with about 50 % room.
Loose enough that it cannot see a missing softcap: the float32 check (1e-3) does. A device run may
spread further; measure it the same way before changing this (docs/real-checkpoints.md)."""
EMBEDDING_TOLERANCE = 1e-5
REDUCED_PRECISION_EMBEDDING_TOLERANCE = 1e-2
"""bf16 host tables against a float32 model: two roundings of 2**-9 each, with room."""


def logit_tolerance_for(backend: str, dtype: str | torch.dtype) -> float:
    """:data:`LOGIT_TOLERANCE` for float32 graphs on the CPU; the reduced-precision bound otherwise."""
    exact = backend_spec(backend).float32_exact and str(dtype).removeprefix("torch.") in ("float32", "fp32")
    return LOGIT_TOLERANCE if exact else REDUCED_PRECISION_LOGIT_TOLERANCE
PROBE_TOKENS = 64


def probe_ids(vocab_size: int, count: int = PROBE_TOKENS) -> torch.Tensor:
    """[1, count] token ids spread over the whole vocabulary (first and last included)."""
    return torch.linspace(0, vocab_size - 1, min(count, vocab_size)).round().long()[None, :]


def _differs(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The largest difference relative to the reference's scale, or None when they agree
    (a NaN or infinite value anywhere never agrees). A reduced-precision side is allowed its
    rounding (:data:`REDUCED_PRECISION_EMBEDDING_TOLERANCE`)."""
    scale = want.abs().max().clamp_min(1e-12)
    err = float((got.double() - want.double()).abs().max() / scale)
    exact = got.dtype == torch.float32 and want.dtype == torch.float32
    return None if err <= (EMBEDDING_TOLERANCE if exact else REDUCED_PRECISION_EMBEDDING_TOLERANCE) else err


@torch.no_grad()
def check_embeddings(model: nn.Module, embeddings: HostEmbeddings | None = None) -> Check:
    """The host embeddings (``embeddings``, default: gathered from ``model``) against the model's
    own embedding modules, word and per-layer."""
    family = family_of(model)
    embeddings = embeddings or HostEmbeddings.from_model(model)
    ids = probe_ids(embeddings.word.shape[0])
    host_words, host_per_layer = embeddings.embed(ids)
    problems = []
    model_words = family.word_embedding(model)(ids)
    word_err = _differs(host_words, model_words)
    if word_err is not None:
        ratio = float(model_words.abs().max() / host_words.abs().max().clamp_min(1e-12))
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


@dataclass
class _RankAttention:
    """What one rank's probe run showed: layers that ran another function, layers it never reached."""

    other: list[int]
    unreached: list[int]
    failure: str | None


def _probe_rank(model: nn.Module, setup: RankSetup, shape: PortShape, r: int) -> tuple[_RankAttention, int]:
    from neuron_port.graph.port import Port
    from neuron_port.parallel.launch import identity_reduce
    from neuron_port.parallel.ranks import make_rank

    family = setup.layout.family
    rank = make_rank(setup, r, identity_reduce, model)
    port = Port.for_rank(rank, PortShape(shape.buckets[:1], shape.kv_lens, shape.ring_buffers))
    bucket = port.buckets[0]
    inputs, store = port.inputs.example_prefill(bucket, 1)
    failure = None
    with attention.recording() as seen:
        try:
            port.graphs.prefill[bucket](*inputs, *store)
        except Exception as exc:  # another attention function can fail on a rank's head counts
            failure = f"{type(exc).__name__}: {exc}"
    modules = [family.attention(layer) for layer in family.decoder_layers(rank.model)]
    ran = [i for i, module in enumerate(modules) if id(module) in seen]
    last = max(ran, default=-1)
    other, unreached = [], []
    for i, module in enumerate(modules):
        if i in ran:
            continue
        # Passed over by a run that went further, or declared as another function by its config.
        if i < last or failure is None or family.attention_implementation(module) not in (None, attention.NAME):
            other.append(i)
        else:
            unreached.append(i)
    return _RankAttention(other, unreached, failure), len(modules)


@torch.no_grad()
def check_attention(model: nn.Module, setup: RankSetup, shape: PortShape) -> Check:
    """Build every rank's graphs over its shard (in this process, all-reduce left out: only which
    function runs matters) and run the smallest prefill once, eagerly, recording which attention
    modules called the library's attention function."""
    results = {}
    for r in range(setup.tp):
        results[r], layers = _probe_rank(model, setup, shape, r)
    other = "; ".join(f"rank {r}: layers {res.other}" for r, res in results.items() if res.other)
    failure = next((res.failure for res in results.values() if res.failure), None)
    stopped = f" (the run stopped at {failure})" if failure else ""
    if other:
        return Check("attention", "fail",
                     f"{other} of {layers} ran another attention function than the library's ({attention.NAME}): "
                     f"a config their modules hold of their own still names another one{stopped}",
                     "set the implementation on every config copy: DecoderFamily.use_attention does it once the "
                     "adapter's set_attention_projections has made its copies; make no config copies after that")
    if failure:
        unreached = "; ".join(f"rank {r}: layers {res.unreached}" for r, res in results.items() if res.unreached)
        where = f" before {unreached} ran" if unreached else ""
        return Check("attention", "fail", f"the graphs failed{where}: {failure}",
                     "run the port at tp 1 to see whether the failure is the adapter's or the sharding's")
    return Check("attention", "pass", f"all {layers} layers of {setup.tp} rank(s) ran {attention.NAME}")


def check_logits(port_logits: Sequence[torch.Tensor], reference_logits: Sequence[torch.Tensor], cap: float | None,
                 tolerance: float = LOGIT_TOLERANCE) -> tuple[Check, LogitReport | None]:
    """Every step's raw port logits, softcapped on the host, against Hugging Face's (``[vocab]`` each).

    The error of a step is ``max |port - reference| / max |reference|``; a NaN or an infinity in
    the port's logits fails the step (and is reported as such, never as a number)."""
    steps = min(len(port_logits), len(reference_logits))
    if steps == 0:
        return Check("logits", "skip", "no steps to compare"), None
    raw = torch.stack([torch.as_tensor(step).reshape(-1) for step in port_logits[:steps]]).double()
    ours = apply_softcap(raw, cap)
    theirs = torch.stack([torch.as_tensor(step).reshape(-1) for step in reference_logits[:steps]]).double()
    per_step = (ours - theirs).abs().amax(dim=-1) / theirs.abs().amax(dim=-1).clamp_min(1e-12)
    broken = ~torch.isfinite(raw).all(dim=-1)  # before the cap, which would turn an infinity into the cap
    per_step = torch.where(broken, torch.full_like(per_step, float("inf")), per_step)
    worst = int(per_step.argmax())
    finite_max = float(per_step[~broken].max()) if bool((~broken).any()) else None
    report = LogitReport(steps, finite_max, worst, tolerance, broken.nonzero().flatten().tolist())
    if bool(broken.any()):
        return Check("logits", "fail", f"step {worst}: the port's logits hold NaN or infinite values "
                                       f"({int(broken.sum())} of {steps} steps)",
                     "an overflow in the graphs (dtype, a missing norm or scale) or an uninitialised buffer"), report
    if not float(per_step.max()) <= tolerance:
        return Check("logits", "fail",
                     f"step {worst}: logits differ from Hugging Face's by {float(per_step.max()):.3g} of the largest "
                     f"(tolerance {tolerance:g}) even where tokens may agree",
                     "a missing or wrong final softcap (the adapter's softcap), a logit scale the model applies "
                     "after its head (fold it into the adapter's lm_head_weight), or a norm; compare the adapter "
                     "with the model's forward"), report
    return Check("logits", "pass", f"{steps} steps within {tolerance:g} of the largest logit "
                                   f"(worst {float(per_step.max()):.2g})"), report


@torch.no_grad()
def check_step_logits(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int],
                      step_logits: Sequence[torch.Tensor],
                      tolerance: float = LOGIT_TOLERANCE) -> tuple[Check, LogitReport | None]:
    """The port's raw logits of every step (row 0 of each ``[batch, vocab]``) against Hugging Face's
    forward over the same prompt and the port's own tokens (teacher-forced: one forward, no drift
    after a divergence), each step after the adapter's softcap."""
    family = family_of(model)
    steps = min(len(tokens), len(step_logits))
    if steps == 0:
        return Check("logits", "skip", "no steps to compare"), None
    reference = teacher_forced_logits(model, list(prompt) + list(tokens[: steps - 1]))[len(prompt) - 1:].float()
    ours = [torch.as_tensor(step).reshape(-1, reference.shape[-1])[0] for step in step_logits[:steps]]
    return check_logits(ours, list(reference), family.softcap(family.text_config_of(model)), tolerance)


QUANT_LOGIT_TOLERANCE = {"int8": 0.18, "int8+head": 0.18}
"""Largest step logit error of a quantized port against the unquantized float32 model, relative to
its largest logit, per scheme, measured by benchmarks/int8_accuracy.py: over 768 steps of 24 real-text
prompts on each of SmolLM2-135M and Gemma-3 270M, the int8 port's largest error was 0.103 with float32
graphs and 0.123 with bf16 ones (p99 0.058 / 0.068), the same as optimum-quanto's qint8 on the same
checkpoints; this is the larger with about 50 % room. ``int8+head`` (``--quant-head``), measured the
same way with float32 graphs: largest 0.108 (SmolLM2) and 0.085 (Gemma-3), p99 0.068 / 0.056, equal to
optimum-quanto's qint8 with the head quantized; ``port --quant int8 --quant-head --check`` with bf16
graphs drifted 0.082 / 0.054 on its prompt. The same 0.18 keeps about 40 % room over the largest. Like
the bf16 bound it cannot see a small adapter error: the ``logits`` check, against the same quantized
model, does."""


def quant_tolerance_for(quant: str) -> float:
    """The measured bound of ``quant`` (:data:`QUANT_LOGIT_TOLERANCE`)."""
    if quant not in QUANT_LOGIT_TOLERANCE:
        raise ValueError(f"no measured logit bound for quant {quant!r}; expected one of {sorted(QUANT_LOGIT_TOLERANCE)}")
    return QUANT_LOGIT_TOLERANCE[quant]


@torch.no_grad()
def check_quant_drift(float_model: nn.Module, prompt: Sequence[int], tokens: Sequence[int],
                      step_logits: Sequence[torch.Tensor], quant: str,
                      judged: bool = True) -> tuple[Check, LogitReport | None]:
    """A quantized port's raw logits of every step against the unquantized ``float_model``
    (teacher-forced on the port's tokens, as :func:`check_step_logits`), within the scheme's measured
    bound: what the quantization costs, where the ``logits`` check (against the same model quantized)
    proves the port computes what the quantized model computes.

    ``judged=False`` (random weights): the drift is reported and the check skips. The bound was
    measured on real checkpoints; random weights, whose logits are nearly flat, drift by a larger
    share of their largest logit and say nothing about a real model."""
    check, report = check_step_logits(float_model, prompt, tokens, step_logits, quant_tolerance_for(quant))
    report = replace(report, quant=quant) if report is not None else None
    if not judged and report is not None:
        worst = report.max_relative_error
        return Check("quant-drift", "skip", f"{quant} against the float32 model: worst step "
                                            f"{'non-finite' if worst is None else f'{worst:.3g}'} of the largest logit, "
                                            "not judged on random weights (the bound is measured on real checkpoints)"), report
    if check.status == "fail":
        return Check("quant-drift", "fail", f"{quant}: {check.detail.replace('Hugging Face', 'the float32 model')}",
                     f"the {quant} weights drift further from the float32 model than benchmarks/int8_accuracy.py "
                     "measured on real checkpoints: look for a projection quantized twice or with the wrong axis, "
                     "or measure this checkpoint with the benchmark"), report
    return Check("quant-drift", check.status, f"{quant} against the float32 model: {check.detail}"), report


def tokens_must_match(backend: str, dtype: str | torch.dtype) -> bool:
    """Whether a checked run must give Hugging Face's float32 tokens exactly: yes for float32 graphs
    on the CPU or XLA; no in reduced precision, where greedy tokens flip at near-ties (bf16 diverged
    within 32 tokens on 33-79 % of real-text prompts, as transformers' own bf16 model does: see
    benchmarks/bf16_accuracy.py) and the logit bound is the verdict. ``seq_match`` is reported either way."""
    return logit_tolerance_for(backend, dtype) == LOGIT_TOLERANCE


def check_loader(model: nn.Module, reference: nn.Module) -> Check:
    """The model the port was built over against Hugging Face's ``from_pretrained`` of the same
    directory: every parameter and buffer (:func:`neuron_port.checks.loader_check.loader_mismatches`)."""
    from neuron_port.checks.loader_check import loader_mismatches, loader_verdict

    found = loader_mismatches(model, reference)
    if found:
        return Check("loader", "fail", f"the library's loader, not the port, is at fault: {loader_verdict(found)}",
                     "neuron_port.model.loading.load_model_dir must compute every non-persistent buffer "
                     "(init_nonpersistent_buffers) and read every checkpoint tensor; the port was built over a wrong model")
    count = sum(1 for _ in reference.named_parameters()) + sum(1 for _ in reference.named_buffers())
    return Check("loader", "pass", f"all {count} parameters and buffers equal transformers' from_pretrained")


def model_self_checks(model: nn.Module, setup: RankSetup, shape: PortShape, prompt: Sequence[int],
                      tokens: Sequence[int], step_logits: Sequence[torch.Tensor],
                      tolerance: float = LOGIT_TOLERANCE, reference: nn.Module | None = None,
                      with_loader: bool = True) -> tuple[list[Check], LogitReport | None]:
    """The checks on a port built over ``model`` (``tokens`` and ``step_logits``: row 0 of its run
    on ``prompt``): embeddings (the port's host tables against the reference's own modules),
    attention on every rank of ``setup``, step logits against the reference, and, when
    ``reference`` (Hugging Face's float32 model; default ``model`` itself) is another model and
    ``with_loader``, the loader check. Returns the checks and the logit report."""
    oracle = model if reference is None else reference
    logits, report = check_step_logits(oracle, prompt, tokens, step_logits, tolerance)
    checks = [check_embeddings(oracle, HostEmbeddings.from_model(model)), check_attention(model, setup, shape), logits]
    if with_loader and reference is not None and reference is not model:
        checks.insert(0, check_loader(model, reference))
    return checks, report


__all__ = [
    "LOGIT_TOLERANCE",
    "REDUCED_PRECISION_LOGIT_TOLERANCE",
    "logit_tolerance_for",
    "QUANT_LOGIT_TOLERANCE",
    "quant_tolerance_for",
    "check_quant_drift",
    "probe_ids",
    "check_embeddings",
    "check_attention",
    "check_logits",
    "check_step_logits",
    "check_loader",
    "model_self_checks",
    "tokens_must_match",
]
