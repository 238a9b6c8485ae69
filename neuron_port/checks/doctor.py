"""Triage of garbage output, cheapest check first.

Every time the field report's port produced garbage the accelerator was innocent: a missing
tokenizer.json, a mis-restored weight reload, a wrong buffer, a mismatched runtime. The doctor
runs those checks before any model does, then a short comparison of the port with the CPU
reference. Each check passes, fails (with the fix) or is skipped because an earlier one failed.

Checks, in order: files, tokenizer, weights (config against checkpoint), buffers (the family's
per-layer buffers, such as Gemma-4's per-layer scalars, present and not reset), artifact (manifest
against this environment), loader (model directories: the library's loader against transformers'
own ``from_pretrained``, every parameter and buffer; a difference blames the loader, not the
port), port (a few greedy tokens against that Hugging Face model on CPU), then the self-checks
of :mod:`neuron_port.checks.selfcheck`: embeddings, attention (model directories), logits of every step
after the softcap. The reference is always transformers' loading, never this library's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from neuron_port.artifacts.record import Manifest
from neuron_port.checks.check import Check
from neuron_port.checks.checked_run import TokenMatch
from neuron_port.checks.selfcheck import model_self_checks
from neuron_port.errors import NeuronPortError
from neuron_port.generation.opened import OpenedModel

SAMPLE_TEXTS = ("hello world", "the capital of france is paris", "water and fire")
UNK_FLOOD = 0.2


def tokenizer_problems(model_dir: Path, vocab_size: int, bos_id: int | None = None) -> list[str]:
    """Sanity of ``tokenizer.json``: present, loadable, round trip, no unknown flood, vocab size, and
    ``bos_id`` (the config's; None when the family adds none) in the vocabulary."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.exists():
        return [f"{path} is missing: the tokenizer would load with no vocabulary and map text to <unk>"]
    if path.stat().st_size == 0:
        return [f"{path} is empty"]
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the finding
        return [f"{path} does not load: {exc}"]
    problems = []
    size = tok.get_vocab_size()
    if size < 8:
        problems.append(f"vocabulary has {size} entries: the tokenizer has effectively no vocabulary")
    if size > vocab_size:
        problems.append(f"tokenizer vocabulary {size} is larger than the model's vocab_size {vocab_size}")
    unk_id = tok.token_to_id("<unk>")
    for text in SAMPLE_TEXTS:
        ids = tok.encode(text).ids
        if not ids:
            problems.append(f"{text!r} encodes to nothing")
            continue
        unk = sum(i == unk_id for i in ids) / len(ids) if unk_id is not None else 0.0
        if unk > UNK_FLOOD:
            problems.append(f"{text!r}: {unk:.0%} of its tokens are <unk> (expected at most {UNK_FLOOD:.0%})")
        elif tok.decode(ids).split() != text.split():
            problems.append(f"round trip of {text!r} gave {tok.decode(ids)!r}")
        if max(ids) >= vocab_size:
            problems.append(f"{text!r} encodes to id {max(ids)} >= the model's vocab_size {vocab_size}")
    if bos_id is not None and tok.id_to_token(bos_id) is None:
        problems.append(f"BOS id {bos_id} is not in the vocabulary (the config names it as the model's first token)")
    return problems


def _files(directory: Path, is_artifact: bool) -> Check:
    want = ["config.json", "tokenizer.json"] + (["manifest.json", "embeddings.safetensors"] if is_artifact else [])
    missing = [f for f in want if not (directory / f).exists()]
    if not is_artifact and not list(directory.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        return Check("files", "fail", f"missing in {directory}: {missing}",
                     "re-download or re-copy the model directory; a partial download leaves tokenizer.json or shards out")
    return Check("files", "pass", f"{', '.join(want)} present")


def _tokenizer_check(opened: OpenedModel) -> Check:
    problems = tokenizer_problems(opened.directory, opened.vocab_size, opened.special.bos)
    if problems:
        return Check("tokenizer", "fail", "; ".join(problems),
                     "fix the tokenizer before suspecting the device: try tok('hello world') by hand")
    return Check("tokenizer", "pass", "round trip, no <unk> flood, BOS present, vocabulary fits the model")


def _weights(opened: OpenedModel) -> tuple[Check, dict[str, torch.Tensor] | None]:
    from neuron_port.model.loading import checkpoint_state, read_checkpoint

    config, family = opened.config, opened.family
    state = read_checkpoint(opened.directory, family)
    causal_lm = family.causal_lm_class(config.model_type)  # imported outside the device mode (torch 2.8)
    with torch.device("meta"):
        model = causal_lm(config)
    expected = {k: tuple(v.shape) for k, v in checkpoint_state(model, clone=False).items()}
    params = {n for n, _ in model.named_parameters()}
    missing = sorted(k for k in expected if k in params and k not in state)
    wrong = sorted(k for k in expected if k in state and tuple(state[k].shape) != expected[k])
    if missing or wrong:
        detail = []
        if missing:
            detail.append(f"{len(missing)} parameters missing from the checkpoint, e.g. {missing[:3]}")
        if wrong:
            detail.append(f"shape mismatches, e.g. {wrong[0]}: {tuple(state[wrong[0]].shape)} vs config {expected[wrong[0]]}")
        return Check("weights", "fail", "; ".join(detail),
                     "the checkpoint does not match config.json (stripped or wrong-size checkpoint)"), None
    return Check("weights", "pass", f"{len(state)} tensors match the config's shapes"), state


def _buffers(state: dict[str, torch.Tensor], opened: OpenedModel) -> Check:
    config, family = opened.config, opened.family
    defaults = family.buffer_defaults()
    names = family.layer_buffer_names()
    if not names:
        return Check("buffers", "pass", f"the {family.name} family has no per-layer buffers to audit")
    results = []
    for name in names:
        keys = [family.layer_buffer_key(i, name) for i in range(family.num_layers(config))]
        missing = [k for k in keys if k not in state]
        if missing:
            return Check("buffers", "fail", f"{len(missing)} of {len(keys)} {name} buffers are missing from the checkpoint",
                         "a parameter-only save or load dropped them: every layer would over-scale; restore buffers "
                         "from the original checkpoint (neuron_port.model.buffers.restore_buffers)")
        values = torch.stack([state[k].float().reshape(-1)[0] for k in keys])
        if name in defaults and torch.all(values == defaults[name]):
            return Check("buffers", "fail",
                         f"every {name} is exactly {defaults[name]} (the default): the buffers were reset",
                         "a parameter-only load reset them; restore from the original checkpoint "
                         "(neuron_port.model.buffers.restore_buffers)")
        results.append(f"{len(keys)} {name} buffers present, range {values.min():.4g}..{values.max():.4g}")
    return Check("buffers", "pass", "; ".join(results))


def _artifact(directory: Path) -> tuple[Check, Manifest | None]:
    """The artifact check, and the manifest it verified (None where it failed)."""
    from neuron_port.artifacts.manifest import verify

    try:
        manifest = verify(directory)
    except NeuronPortError as exc:
        return Check("artifact", "fail", str(exc), "rebuild the artifact with `neuron-port compile` in this environment"), None
    detail = f"manifest verified ({len(manifest.files)} files, backend {manifest.backend}, tp {manifest.tp})"
    return Check("artifact", "pass", detail), manifest


def _probe_prompt(opened: OpenedModel, bucket: int) -> list[int]:
    """BOS (the config's, when the family has one) then consecutive ordinary ids, within ``bucket``."""
    bos = opened.special.bos
    head = [bos] if bos is not None else []
    return head + list(range(4, 4 + min(11, bucket - len(head))))


def _port_model_dir(opened: OpenedModel, tokens: int) -> list[Check]:
    """The library's loader against transformers' ``from_pretrained`` (the reference), then the
    port's tokens against that reference and the self-checks tokens cannot replace."""
    from neuron_port.checks.reference import hf_reference_model
    from neuron_port.checks.selfcheck import check_loader
    from neuron_port.checks.validation import compare_with_reference
    from neuron_port.generation.generate import generate
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import load_model_dir
    from neuron_port.parallel.ranks import RankSetup

    reference = hf_reference_model(opened.directory)
    model = load_model_dir(opened.directory)
    loader = check_loader(model, reference)
    if loader.status == "fail":
        return [loader, Check("port", "skip", "the port would be built over the wrongly loaded model: fix the loader first")]
    prompt = _probe_prompt(opened, 16)
    shape = PortShape([16], 64)
    setup = RankSetup.for_layout(describe(model), 1)
    got = generate(model, GenerationRequest.greedy([prompt], tokens, keep_logits=True), shape=shape, setup=setup)
    checks, _ = model_self_checks(
        model, setup, shape, prompt, got.tokens[0], got.step_logits, reference=reference, with_loader=False
    )
    match = compare_with_reference(got.tokens[0], reference, prompt, tokens)
    return [loader, _port_verdict(len(got.tokens[0]), match), *checks]


def _port_artifact(opened: OpenedModel, manifest: Manifest, tokens: int) -> list[Check]:
    """The artifact's tokens, host embeddings and step logits against the checkpoint it was built from
    (``manifest``: what the artifact check verified)."""
    from neuron_port.checks.reference import reference_model
    from neuron_port.checks.validation import artifact_self_checks, compare_with_reference
    from neuron_port.generation.generate import generate
    from neuron_port.generation.request import GenerationRequest

    prompt = _probe_prompt(opened, max(manifest.shape.buckets))
    directory = opened.directory
    reference = reference_model(manifest)
    result = generate(directory, GenerationRequest.greedy([prompt], tokens, keep_logits=True), manifest=manifest)
    checked = artifact_self_checks(directory, manifest, reference, prompt, result)
    match = compare_with_reference(result.tokens[0], reference, prompt, tokens)
    return [_port_verdict(len(result.tokens[0]), match), *checked.checks]


def _port_verdict(new_tokens: int, match: TokenMatch) -> Check:
    div = match.divergence
    if div is None:
        return Check("port", "pass", f"{new_tokens} greedy tokens equal Hugging Face generate on CPU")
    kind = div.kind if div.kind != "length differs" else "length"
    return Check(
        "port",
        "fail",
        f"first divergence at token {div.index} ({kind})",
        "the reference is transformers' own from_pretrained and the earlier checks passed: suspect the "
        "port/graphs or the runtime",
    )


def run_doctor(directory: str | Path, tokens: int = 8) -> list[Check]:
    """All checks, cheapest first; later ones are skipped when what they need failed."""
    directory = Path(directory)
    is_artifact = (directory / "manifest.json").exists()
    checks = [_files(directory, is_artifact)]
    try:
        opened = OpenedModel.open(directory)
    except NeuronPortError as exc:
        checks.append(
            Check(
                "config",
                "fail",
                str(exc),
                "config.json must be a config of a supported family (neuron_port.families.supported_model_types())",
            )
        )
        return checks
    checks.append(_tokenizer_check(opened))
    state, manifest = None, None
    if is_artifact:
        checks.append(Check("weights", "skip", "artifact: weights are covered by the manifest's file hashes"))
        checks.append(Check("buffers", "skip", "artifact: buffers are inside the compiled graphs"))
        check, manifest = _artifact(directory)
        checks.append(check)
    else:
        weights, state = _weights(opened)
        checks.append(weights)
        checks.append(_buffers(state, opened) if state is not None else Check("buffers", "skip", "weights failed"))
        checks.append(Check("artifact", "skip", "not an artifact directory"))
    if any(c.status == "fail" for c in checks):
        checks.append(Check("port", "skip", "an earlier check failed; fix it first (it is cheaper)"))
    elif manifest is not None:
        checks += _port_artifact(opened, manifest, tokens)
    else:
        checks += _port_model_dir(opened, tokens)
    return checks


def report(checks: list[Check]) -> dict[str, Any]:
    failed = [c for c in checks if c.status == "fail"]
    return {"ok": not failed, "first_failure": failed[0].name if failed else None,
            "checks": [check.to_json() for check in checks]}


def format_doctor_report(checks: list[Check]) -> str:
    failed = [c for c in checks if c.status == "fail"]
    lines = [f"FAILED: {failed[0].name} — {failed[0].detail}" if failed else "OK: every check passed"]
    for c in checks:
        lines.append(f"[{c.status:4}] {c.name:9} {c.detail}")
        if c.status == "fail" and c.fix:
            lines.append(f"        fix: {c.fix}")
    return "\n".join(lines)


__all__ = ["tokenizer_problems", "run_doctor", "report", "format_doctor_report"]
