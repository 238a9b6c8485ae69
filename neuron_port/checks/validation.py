"""Checking a port against Hugging Face, in this process or in a fresh one.

:func:`artifact_run_report` is what generating from an artifact directory alone reports;
:func:`artifact_self_checks` checks such a run (a :class:`~neuron_port.checks.checked_run.CheckedRun`);
:func:`compare_with_reference` matches tokens against Hugging Face ``generate`` on the same checkpoint
(first divergence classified); :func:`check_artifact` is all of it. :func:`check_in_fresh_process`
runs :func:`check_artifact` in a new Python interpreter — the artifact loaded exactly as a server loads it, nothing inherited
from this process — and returns its result as data (the child writes it to a file; no command
output is parsed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from neuron_port.artifacts.manifest import verify
from neuron_port.artifacts.record import Manifest
from neuron_port.checks.check import Check
from neuron_port.checks.checked_run import CheckedRun, TokenMatch
from neuron_port.checks.oracle import match_reference, reference_generate
from neuron_port.checks.reference import reference_model, unquantized_reference_model
from neuron_port.errors import ArtifactError
from neuron_port.generation.generate import generate
from neuron_port.generation.opened import OpenedModel
from neuron_port.generation.request import GenerationRequest, GenerationResult
from neuron_port.model.configs import load_config


def artifact_prompt(directory: str | Path, prompt_len: int, seed: int = 0) -> list[int]:
    """A seeded random prompt for an artifact's model (BOS first when its family has one)."""
    return OpenedModel.open(directory).random_prompt(prompt_len, seed)


def artifact_run_report(directory: str | Path, manifest: Manifest, prompt: Sequence[int],
                        result: GenerationResult) -> dict[str, Any]:
    """Row 0 of a generation from the artifact: the JSON fields ``neuron-port generate --json`` prints."""
    return {
        "artifact": str(Path(directory).resolve()),
        "backend": manifest.backend,
        "tp": manifest.tp,
        "prompt_tokens": len(prompt),
        "new_tokens": len(result.tokens[0]),
        "tokens": result.tokens[0],
        "finish_reason": result.finish_reasons[0],
        "prefill_s": round(result.prefill_s, 6),
        "decode_tok_per_s": result.decode_tok_per_s,
        "step_kv_lens": result.step_kv_lens,
    }


def compare_with_reference(tokens: Sequence[int], reference: nn.Module, prompt: Sequence[int], max_new_tokens: int,
                           stop_ids: Sequence[int] = ()) -> TokenMatch:
    """``tokens`` against Hugging Face ``generate`` on ``reference`` from ``prompt``."""
    return match_reference(tokens, reference_generate(reference, list(prompt), max_new_tokens, list(stop_ids)))


def artifact_self_checks(directory: str | Path, manifest: Manifest, reference: nn.Module, prompt: Sequence[int],
                         result: GenerationResult) -> CheckedRun:
    """The self-checks an artifact allows on row 0 of ``result`` (a run that kept its logits), against
    the checkpoint it was built from: its host embedding files, and every step's logits after the
    softcap; a quantized artifact's drift from the float32 model besides. The run's JSON fields are
    :func:`artifact_run_report`'s."""
    from neuron_port.checks.selfcheck import (
        check_embeddings,
        check_quant_drift,
        check_step_logits,
        logit_tolerance_for,
        tokens_must_match,
    )
    from neuron_port.graph.embedding import load_host_embeddings

    tokens = result.tokens[0]
    tolerance = logit_tolerance_for(manifest.backend, manifest.dtype)
    logits, report = check_step_logits(reference, prompt, tokens, result.step_logits, tolerance)
    config = load_config(Path(directory) / "config.json")
    checked = CheckedRun(run=artifact_run_report(directory, manifest, prompt, result),
                         checks=[check_embeddings(reference, load_host_embeddings(directory, config)),
                                 Check("attention", "skip", "compiled graphs run no Python: the attention check runs on "
                                                            "a model"), logits],
                         logits=report, tokens_must_match=tokens_must_match(manifest.backend, manifest.dtype))
    quant = manifest.source.quant
    if quant != "none":  # what the quantization costs: the same steps against the float32 model it came from
        check, checked.quant = check_quant_drift(unquantized_reference_model(manifest), prompt, tokens,
                                                 result.step_logits, quant, judged=manifest.source.is_checkpoint)
        checked.checks.append(check)
    return checked


def check_artifact(directory: str | Path, prompt_len: int = 24, max_new_tokens: int = 32,
                   prompt: Sequence[int] | None = None, stop_ids: Sequence[int] = (), seed: int = 0) -> CheckedRun:
    """Generate from the artifact and compare with Hugging Face on the artifact's own checkpoint
    (rebuilt from the manifest's source and proven by its weights fingerprint): tokens, and the
    self-checks (:func:`artifact_self_checks`)."""
    manifest = verify(directory)
    prompt = list(prompt) if prompt is not None else artifact_prompt(directory, prompt_len, seed)
    request = GenerationRequest.greedy([prompt], max_new_tokens, stop_ids, keep_logits=True)
    result = generate(directory, request, manifest=manifest)
    reference = reference_model(manifest)
    checked = artifact_self_checks(directory, manifest, reference, prompt, result)
    checked.match = compare_with_reference(result.tokens[0], reference, prompt, max_new_tokens, stop_ids)
    return checked


def _fresh_main(request_path: str, result_path: str) -> None:
    """The child's side of :func:`check_in_fresh_process`: run the check, write the result or the error."""
    request = json.loads(Path(request_path).read_text())
    try:
        result = {"ok": True, "result": check_artifact(**request).to_json()}
    except Exception as exc:  # noqa: BLE001 - handed back to the parent with its type
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    Path(result_path).write_text(json.dumps(result))


def check_in_fresh_process(directory: str | Path, prompt_len: int = 24, max_new_tokens: int = 32,
                           timeout_s: float = 900, prompt: Sequence[int] | None = None,
                           stop_ids: Sequence[int] = ()) -> CheckedRun:
    """:func:`check_artifact` in a new Python process, from the directory alone (``prompt``: ids
    to use instead of a random prompt of ``prompt_len``; ``stop_ids``: end-of-sequence ids).

    Returns its result, read back from the JSON the child wrote. Raises ArtifactError with the
    child's message if it failed."""
    request = {"directory": str(Path(directory).resolve()), "prompt_len": prompt_len, "max_new_tokens": max_new_tokens,
               "prompt": list(prompt) if prompt is not None else None, "stop_ids": list(stop_ids)}
    with tempfile.TemporaryDirectory(prefix="neuron_port_check_") as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_path.write_text(json.dumps(request))
        code = "import sys; from neuron_port.checks.validation import _fresh_main; _fresh_main(sys.argv[1], sys.argv[2])"
        proc = subprocess.run([sys.executable, "-c", code, str(request_path), str(result_path)],
                              capture_output=True, text=True, timeout=timeout_s)
        if not result_path.exists():
            raise ArtifactError(f"fresh-process check died (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
        answer = json.loads(result_path.read_text())
    if not answer["ok"]:
        raise ArtifactError(f"fresh-process check failed: {answer['error']}")
    return CheckedRun.from_json(answer["result"])


__all__ = ["artifact_prompt", "artifact_run_report", "compare_with_reference", "artifact_self_checks", "check_artifact",
           "check_in_fresh_process"]
