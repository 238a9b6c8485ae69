"""What a generation is asked and what it gives back: one request type and one result type.

A :class:`GenerationRequest` is a batch of prompts with each row's :class:`GenerationParams`;
:func:`neuron_port.generation.generate.generate` takes one for any source (a model, a port, an
artifact) and returns a :class:`GenerationResult`. The result stays an object inside a process;
it becomes JSON-able data only where it crosses one (:meth:`GenerationResult.to_wire` and
:meth:`GenerationResult.from_wire`: a gloo rank's result, the fresh-process check) or reaches a
user (:meth:`GenerationResult.to_json`, what ``neuron-port generate --json`` prints).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from neuron_port.generation.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationParams:
    """How one row decodes: how far, how it samples, where it stops, what it reports."""

    max_new_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; k: the chosen token's log-probability and the k most likely
    # None: the prompt is prefilled at once; k: every prompt token after the first is scored (its
    # log-probability given the tokens before it, and the k most likely), and max_new_tokens may be 0
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        least = 0 if self.prompt_logprobs is not None else 1
        if self.max_new_tokens < least:
            raise ValueError(f"max_new_tokens must be at least {least}{' (0 scores the prompt alone)' if least else ''}, "
                             f"found {self.max_new_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, found {value}")


@dataclass(frozen=True, init=False)
class GenerationRequest:
    """A batch of prompts (``[batch][prompt tokens]``) and each row's parameters.

    ``params``: one :class:`GenerationParams` for every row, or one per row. ``keep_logits``: the
    result carries the raw logits [batch, vocab] of every step (before the host softcap). ``draft_tokens``:
    speculative decoding by prompt lookup, up to that many drafted tokens checked per verify step (0: none; the
    port must be built with at least as many, ``PortShape(..., draft_tokens=)``)."""

    prompts: tuple[tuple[int, ...], ...]
    params: tuple[GenerationParams, ...]
    keep_logits: bool
    draft_tokens: int = 0

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        params: GenerationParams | Sequence[GenerationParams] = GenerationParams(),
        keep_logits: bool = False,
        draft_tokens: int = 0,
    ):
        rows = tuple(tuple(int(t) for t in p) for p in prompts)
        per_row = tuple(params) if isinstance(params, (list, tuple)) else (params,) * len(rows)
        if not rows or min(len(p) for p in rows) < 1:
            raise ValueError(
                f"a request needs at least one prompt and every prompt at least one token, "
                f"found prompt lengths {[len(p) for p in rows]}"
            )
        if len(per_row) != len(rows):
            raise ValueError(f"{len(rows)} prompts but {len(per_row)} parameter sets: give one for all or one per prompt")
        object.__setattr__(self, "prompts", rows)
        object.__setattr__(self, "params", per_row)
        object.__setattr__(self, "keep_logits", bool(keep_logits))
        if int(draft_tokens) < 0:
            raise ValueError(f"draft_tokens is 0 (no speculation) or more, found {draft_tokens}")
        if draft_tokens and keep_logits:
            raise ValueError("a request keeping every step's logits runs plain steps: verify steps keep none yet "
                             "(drop keep_logits or draft_tokens)")
        object.__setattr__(self, "draft_tokens", int(draft_tokens))

    @classmethod
    def greedy(
        cls, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (), keep_logits: bool = False,
        draft_tokens: int = 0,
    ) -> GenerationRequest:
        """Greedy decoding of every prompt for up to ``max_new_tokens``, stopping at ``stop_ids``."""
        return cls(prompts, GenerationParams(int(max_new_tokens), stop_token_ids=tuple(int(t) for t in stop_ids)), keep_logits,
                   draft_tokens)

    @property
    def batch(self) -> int:
        return len(self.prompts)

    def without_logits(self) -> GenerationRequest:
        return GenerationRequest(self.prompts, self.params, False, self.draft_tokens)


@dataclass
class GenerationResult:
    """Every row's output and the run's timings, with what the KV store held on every rank.

    Per row (``[batch]``): ``tokens`` generated, ``texts`` they released (empty without a
    tokenizer), ``finish_reasons`` (``stop``, ``length``, ``cancelled``; None while running).
    ``step_logits``: rank 0's raw logits of every step, [batch, vocab] each, when the request kept
    them; ``step_kv_lens``: the KV length of the graph each decode step ran (the smallest that
    held every live row: a short context reads a short store). ``per_rank_kv_cache_bytes``: each
    rank's store at its largest KV length;
    ``kv_cache_bytes_per_layer``: rank 0's, by owner layer; ``rank_disagreement``: some rank
    produced other tokens than rank 0 (a broken collective); ``lowering``: the XLA backend's report
    of its graphs when the source was lowered through torch-xla. ``drafted`` and ``accepted``: speculative
    decoding's drafted tokens verified and those kept (rank 0's)."""

    tokens: list[list[int]]
    texts: list[str]
    finish_reasons: list[str | None]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    host_s: float = 0.0
    graph_s: float = 0.0
    kv_len: int = 0
    step_kv_lens: list[int] = field(default_factory=list)  # the KV length each decode step's graph read
    step_logits: list[torch.Tensor] = field(default_factory=list)
    per_rank_kv_cache_bytes: list[int] = field(default_factory=list)
    kv_cache_bytes_per_layer: dict[str, int] = field(default_factory=dict)
    dtype_bytes: int = 4
    rank_disagreement: bool = False
    lowering: dict[str, Any] | None = None  # how the graphs lowered, where the backend reports it (xla)
    drafted: int = 0
    accepted: int = 0

    @classmethod
    def empty(cls, batch: int) -> GenerationResult:
        return cls([[] for _ in range(batch)], ["" for _ in range(batch)], [None] * batch)

    @property
    def decode_tok_per_s(self) -> float | None:
        """Tokens a row made per second of decoding (after its first, from the prefill): the longest row's, so a
        plain run's decode steps per second, and a speculative run's tokens, several a step."""
        made = max((len(t) for t in self.tokens), default=1) - 1
        return round(made / self.decode_s, 3) if self.decode_s > 0 else None

    @property
    def kv_cache_bytes(self) -> int:
        return sum(self.per_rank_kv_cache_bytes)

    def to_json(self) -> dict[str, Any]:
        """Tokens, finish reasons, timings and KV bytes as ``generate --json`` reports them (no logits)."""
        out = {
            "tokens": self.tokens,
            "finish_reasons": self.finish_reasons,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "decode_steps": self.decode_steps,
            "host_s": self.host_s,
            "decode_tok_per_s": self.decode_tok_per_s,
            "kv_cache_bytes": self.kv_cache_bytes,
            "per_rank_kv_cache_bytes": self.per_rank_kv_cache_bytes,
            "kv_cache_bytes_per_layer": self.kv_cache_bytes_per_layer,
            "dtype_bytes": self.dtype_bytes,
        }
        if self.rank_disagreement:
            out["rank_disagreement"] = True
        return out

    def to_wire(self) -> dict[str, Any]:
        """Every field as JSON-able data (logits as nested lists), for a result crossing a process."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["step_logits"] = [step.tolist() for step in self.step_logits]
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> GenerationResult:
        """The result :meth:`to_wire` wrote (logits back as float32 tensors)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"a generation result has the fields {sorted(known)}, found also {unknown}")
        values = dict(data)
        values["step_logits"] = [torch.as_tensor(step, dtype=torch.float32) for step in data.get("step_logits", [])]
        return cls(**values)


def merge_ranks(results: Sequence[GenerationResult]) -> GenerationResult:
    """One result from every rank's (rank 0 first): rank 0's rows, timings and logits, every
    rank's KV bytes, and whether any rank's tokens differ from rank 0's."""
    first = results[0]
    return replace(first, per_rank_kv_cache_bytes=[b for r in results for b in r.per_rank_kv_cache_bytes],
                   rank_disagreement=any(r.tokens != first.tokens for r in results[1:]))


__all__ = ["GenerationParams", "GenerationRequest", "GenerationResult", "merge_ranks"]
