"""What a checked run found, as records: the logit report, the token match against Hugging Face, and
the run's verdict.

Inside a process the checks hand these objects along (tensors stay out of them); JSON is made only
where a result leaves the process, by :meth:`CheckedRun.to_json` (the fields ``port --check --json``,
``generate --check --json`` and the fresh-process check print: ``self_checks``, ``logit_check``,
``self_checks_passed``, ``quant_check``, ``tokens_must_match``, ``reference_tokens``, ``divergence``,
``seq_match``), and read back by :meth:`CheckedRun.from_json` on the other side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_port.checks.check import Check


@dataclass(frozen=True)
class LogitReport:
    """Every step's logits against a reference: ``max_relative_error`` is the worst finite step's
    ``max |port - reference| / max |reference|`` (None when no step was finite), ``worst_step`` its
    index, ``non_finite_steps`` the steps holding NaN or infinity; ``quant`` names the scheme when the
    reference is the unquantized model (the ``quant-drift`` check)."""

    steps: int
    max_relative_error: float | None
    worst_step: int
    tolerance: float
    non_finite_steps: list[int] = field(default_factory=list)
    quant: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.quant is None:
            del out["quant"]
        return out


@dataclass(frozen=True)
class Divergence:
    """Where a port's tokens first leave the reference's: ``kind`` ``near_tie`` (the reference's two
    best logits within the tolerance and the port chose one of them), ``error``, or ``length differs``
    (one sequence ended first: no tokens or gap to report)."""

    index: int
    kind: str
    port_token: int | None = None
    reference_token: int | None = None
    reference_top2_gap: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Divergence | None:
        return None if data is None else cls(**data)


@dataclass(frozen=True)
class ReferenceRun:
    """Hugging Face ``generate`` on CPU: its new tokens and the ``[vocab]`` logits of every step."""

    tokens: list[int]
    logits: list[Any] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class TokenMatch:
    """A run's tokens against the reference's: equal, or the first divergence classified."""

    reference_tokens: list[int]
    divergence: Divergence | None

    @property
    def seq_match(self) -> bool:
        return self.divergence is None

    def to_json(self) -> dict[str, Any]:
        return {"reference_tokens": self.reference_tokens,
                "divergence": None if self.divergence is None else self.divergence.to_json(),
                "seq_match": self.seq_match}


@dataclass
class CheckedRun:
    """A run checked against its oracle.

    ``run``: the run's own JSON fields (tokens, backend, timings: what the command prints without
    ``--check``); ``checks``: the self-checks in order; ``logits``: the ``logits`` check's report;
    ``quant``: the ``quant-drift`` report of a quantized run; ``match``: row 0's tokens against Hugging
    Face (None until compared); ``row_matches``: every row's, for a batch; ``tokens_must_match``: whether
    a token divergence fails the run (float32) or only the logit bound decides (reduced precision)."""

    run: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    logits: LogitReport | None = None
    quant: LogitReport | None = None
    match: TokenMatch | None = None
    row_matches: list[TokenMatch] = field(default_factory=list)
    tokens_must_match: bool = True

    @property
    def self_checks_passed(self) -> bool:
        """No self-check failed (a skip is not a failure)."""
        return not any(check.failed for check in self.checks)

    @property
    def seq_match(self) -> bool | None:
        """Every compared row's tokens equal the reference's (None when nothing was compared)."""
        matches = self.row_matches or ([self.match] if self.match is not None else [])
        return all(m.seq_match for m in matches) if matches else None

    @property
    def passed(self) -> bool:
        """The verdict: the self-checks passed, and the tokens matched where ``tokens_must_match``
        requires it."""
        tokens_ok = self.seq_match is not False or not self.tokens_must_match
        return bool(tokens_ok and self.self_checks_passed)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if check.failed]

    def to_json(self) -> dict[str, Any]:
        """The run's fields and what the checks found, as the commands print them."""
        out = dict(self.run)
        if self.checks or self.logits is not None:
            out.update(self_checks=[check.to_json() for check in self.checks],
                       logit_check=self.logits.to_json() if self.logits is not None else {},
                       self_checks_passed=self.self_checks_passed, tokens_must_match=self.tokens_must_match)
        if self.quant is not None:
            out["quant_check"] = self.quant.to_json()
        if self.match is not None:
            out.update(self.match.to_json())
            out["seq_match"] = self.seq_match
        if self.row_matches and "rows" in out:
            out["rows"] = [dict(row) for row in out["rows"]]
            for row, match in zip(out["rows"], self.row_matches, strict=True):
                row.update(match.to_json())
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckedRun:
        """Back from :meth:`to_json` (the fresh-process check's answer)."""
        run = dict(data)
        checks = [Check(**check) for check in run.pop("self_checks", [])]
        logit_report, quant = run.pop("logit_check", None), run.pop("quant_check", None)
        tokens_must_match = run.pop("tokens_must_match", True)
        match = None
        if "reference_tokens" in run:
            match = TokenMatch(run.pop("reference_tokens"), Divergence.from_json(run.pop("divergence", None)))
        rows = [dict(row) for row in run.get("rows") or []]
        row_matches = [TokenMatch(row.pop("reference_tokens"), Divergence.from_json(row.pop("divergence", None)))
                       for row in rows if "reference_tokens" in row]
        for row in rows:
            row.pop("seq_match", None)
        if rows:
            run["rows"] = rows
        for derived in ("self_checks_passed", "seq_match"):
            run.pop(derived, None)
        return cls(run=run, checks=checks, logits=LogitReport(**logit_report) if logit_report else None,
                   quant=LogitReport(**quant) if quant else None, match=match, row_matches=row_matches,
                   tokens_must_match=tokens_must_match)


__all__ = ["LogitReport", "Divergence", "ReferenceRun", "TokenMatch", "CheckedRun"]
