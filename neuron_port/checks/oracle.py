"""The CPU reference, the comparisons against it, and the checks of the reference itself.

* Reference: Hugging Face's own model from the same checkpoint — greedy ``generate`` (default
  cache) and teacher-forced logits.
* Comparisons: token-for-token match with the first divergence; per-step logit metrics (max
  absolute and relative error, cosine, top-k agreement); a logit check with a tolerance per
  top-k set (looser for the whole vocabulary, tighter for the top few, in the spirit of the
  vendor's logit validation); and a divergence rule that tells a near-tie (the reference's two
  best logits within ``near_tie_tol``) from a real error.
* Golden integrity: a golden (reference tokens and logits) records the fingerprint and tensor
  list of the checkpoint it came from. Comparing a model with a golden from another checkpoint
  — say one with the per-layer embedding dropped — is refused, never reported as a pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from neuron_port.artifacts.manifest import weights_fingerprint
from neuron_port.checks.checked_run import Divergence, ReferenceRun, TokenMatch
from neuron_port.errors import GoldenMismatchError


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    from neuron_port.model.loading import checkpoint_state

    return checkpoint_state(model, clone=False)


# ---- reference ---------------------------------------------------------------------------------
@torch.no_grad()
def reference_generate(model: nn.Module, prompt: Sequence[int], max_new_tokens: int,
                       stop_ids: Sequence[int] = ()) -> ReferenceRun:
    """Hugging Face ``generate`` (greedy, default cache): new tokens and the logits of every step."""
    from neuron_port.families import family_of

    family = family_of(model)
    ids = torch.tensor([list(prompt)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        **family.generation_kwargs(family.text_config_of(model), list(stop_ids)),
        output_logits=True,
        return_dict_in_generate=True,
    )
    return ReferenceRun(out.sequences[0, len(prompt):].tolist(), [step[0] for step in out.logits])


@torch.no_grad()
def teacher_forced_logits(model: nn.Module, tokens: Sequence[int]) -> torch.Tensor:
    """[len(tokens), vocab] logits of one full forward over ``tokens``."""
    return model(torch.tensor([list(tokens)])).logits[0]


# ---- comparisons -------------------------------------------------------------------------------
@dataclass
class TokenComparison:
    match: bool
    first_divergence: int | None
    got: list[int]
    want: list[int]


def compare_tokens(got: Sequence[int], want: Sequence[int]) -> TokenComparison:
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if first is None and len(got) != len(want):
        first = min(len(got), len(want))
    return TokenComparison(first is None, first, list(got), list(want))


def logit_metrics(got: torch.Tensor, want: torch.Tensor, top_ks: Sequence[int] = (1, 5, 10)) -> dict:
    """got / want: [steps, vocab]. Max abs/rel error, minimum cosine, top-k agreement per k."""
    got, want = got.double(), want.double()
    diff = (got - want).abs()
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    agreement = {}
    for k in top_ks:
        a = torch.topk(got, k, dim=-1).indices.sort(-1).values
        b = torch.topk(want, k, dim=-1).indices.sort(-1).values
        agreement[str(k)] = float((a == b).all(-1).double().mean())
    return {
        "max_abs_error": float(diff.max()),
        "max_rel_error": float(diff.max() / want.abs().max().clamp_min(1e-12)),
        "min_cosine": float(cos.min()),
        "topk_agreement": agreement,
    }


def classify_divergence(index: int, port_token: int, reference_logits: torch.Tensor, near_tie_tol: float = 1e-2) -> Divergence:
    """At the first divergent step: a near-tie when the reference's top-2 logits are within the tolerance
    and the port chose one of them; otherwise an error."""
    top = torch.topk(reference_logits.double(), 2)
    gap = float(top.values[0] - top.values[1])
    ref_token = int(top.indices[0])
    near = gap <= near_tie_tol and port_token in top.indices.tolist()
    return Divergence(index, "near_tie" if near else "error", int(port_token), ref_token, gap)


def first_divergence(tokens: Sequence[int], reference: Sequence[int],
                     reference_logits: Sequence[torch.Tensor]) -> Divergence | None:
    """The port's first departure from the reference, classified (near-tie or error); None when
    the sequences match."""
    cmp = compare_tokens(tokens, reference)
    if cmp.match:
        return None
    i = cmp.first_divergence
    if i < len(tokens) and i < len(reference_logits):
        return classify_divergence(i, tokens[i], reference_logits[i])
    return Divergence(i, "length differs")


def match_reference(tokens: Sequence[int], reference: ReferenceRun) -> TokenMatch:
    """``tokens`` against the reference run's: equal, or the first divergence classified."""
    return TokenMatch(list(reference.tokens), first_divergence(tokens, reference.tokens, reference.logits))


# ---- goldens -----------------------------------------------------------------------------------
@dataclass
class Golden:
    prompt: list[int]
    tokens: list[int]
    logits: torch.Tensor  # [steps, vocab]
    fingerprint: str
    tensor_names: list[str] = field(default_factory=list)

    def save(self, directory: str | Path) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        save_file({"logits": self.logits.contiguous()}, str(out / "golden_logits.safetensors"))
        meta = {k: v for k, v in asdict(self).items() if k != "logits"}
        (out / "golden.json").write_text(json.dumps(meta, indent=2))
        return out

    @classmethod
    def load(cls, directory: str | Path) -> Golden:
        meta = json.loads((Path(directory) / "golden.json").read_text())
        logits = load_file(str(Path(directory) / "golden_logits.safetensors"))["logits"]
        return cls(logits=logits, **meta)


def make_golden(model: nn.Module, prompt: Sequence[int], max_new_tokens: int,
                checkpoint: dict[str, torch.Tensor] | None = None) -> Golden:
    """Reference tokens and logits of ``model``, stamped with the checkpoint they came from.

    ``checkpoint``: the tensors as read from disk (default: the model's own state). A loader
    that re-initialises tensors missing from disk gives a model whose state looks complete; the
    checkpoint itself shows what was really there.
    """
    ref = reference_generate(model, prompt, max_new_tokens)
    state = dict(checkpoint) if checkpoint is not None else _state(model)
    return Golden(list(prompt), ref.tokens, torch.stack(ref.logits), weights_fingerprint(state), sorted(state))


def check_golden_matches(golden: Golden, model: nn.Module) -> None:
    """Refuse a golden from another checkpoint, naming the tensors that differ in presence."""
    state = _state(model)
    found = weights_fingerprint(state)
    if found == golden.fingerprint:
        return
    missing = sorted(set(state) - set(golden.tensor_names))
    extra = sorted(set(golden.tensor_names) - set(state))
    detail = []
    if missing:
        detail.append(f"the golden's checkpoint lacks {missing[:5]}")
    if extra:
        detail.append(f"the model under test lacks {extra[:5]}")
    if not detail:
        detail.append("same tensor names, different contents")
    raise GoldenMismatchError(
        f"refusing to compare: the golden was made from checkpoint {golden.fingerprint[:16]}…, the model under test is "
        f"{found[:16]}… ({'; '.join(detail)}). A golden from another checkpoint can agree with a wrong port."
    )


def compare_with_golden(golden: Golden, model: nn.Module, port_tokens: Sequence[int],
                        port_logits: torch.Tensor | None = None) -> dict:
    """Token and logit comparison of a port's output against a golden of the same checkpoint."""
    check_golden_matches(golden, model)
    tokens = compare_tokens(port_tokens, golden.tokens)
    out = {"seq_match": tokens.match, "first_divergence": tokens.first_divergence}
    if port_logits is not None:
        steps = min(port_logits.shape[0], golden.logits.shape[0])
        out["logits"] = logit_metrics(port_logits[:steps], golden.logits[:steps])
    if (
        tokens.first_divergence is not None
        and tokens.first_divergence < golden.logits.shape[0]
        and tokens.first_divergence < len(port_tokens)
    ):
        i = tokens.first_divergence
        out["divergence"] = classify_divergence(i, port_tokens[i], golden.logits[i]).to_json()
    return out


__all__ = [
    "reference_generate",
    "teacher_forced_logits",
    "TokenComparison",
    "compare_tokens",
    "logit_metrics",
    "classify_divergence",
    "first_divergence",
    "match_reference",
    "Golden",
    "make_golden",
    "check_golden_matches",
    "compare_with_golden",
]
