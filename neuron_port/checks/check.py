"""One verdict type for every check the library makes: self-checks, lint findings, artifact checks, the doctor.

A :class:`Check` names what was checked, its status, what was found and how to fix it; a lint
finding also says where (the graph and op). Two JSON renderings keep what the commands print:
:meth:`Check.to_json` (``name``, ``status``, ``detail``, ``fix``: the doctor and a checked run's
``self_checks``) and :meth:`Check.to_finding` (``rule``, ``severity``, ``where``, ``detail``,
``fix``: ``neuron-port lint --json``), whose severities map onto the statuses one to one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATUSES = ("pass", "fail", "warn", "info", "skip")
SEVERITY_OF_STATUS = {"fail": "error", "warn": "warning", "info": "info"}
STATUS_OF_SEVERITY = {severity: status for status, severity in SEVERITY_OF_STATUS.items()}


@dataclass(frozen=True)
class Check:
    """``name``: what was checked (a lint finding's rule); ``status``: one of :data:`STATUSES`;
    ``where``: the graph, op or file a finding points at (empty for the others)."""

    name: str
    status: str
    detail: str
    fix: str = ""
    where: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"a check's status is one of {STATUSES}, found {self.status!r}")

    @classmethod
    def finding(cls, rule: str, severity: str, where: str, detail: str, fix: str) -> Check:
        """A lint finding: ``severity`` ``error``, ``warning`` or ``info``."""
        if severity not in STATUS_OF_SEVERITY:
            raise ValueError(f"a finding's severity is one of {sorted(STATUS_OF_SEVERITY)}, found {severity!r}")
        return cls(rule, STATUS_OF_SEVERITY[severity], detail, fix, where)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    @property
    def severity(self) -> str:
        """The lint severity of this check (``error`` for a failure)."""
        if self.status not in SEVERITY_OF_STATUS:
            raise ValueError(f"a {self.status!r} check has no lint severity")
        return SEVERITY_OF_STATUS[self.status]

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}
        if self.where:
            out["where"] = self.where
        return out

    def to_finding(self) -> dict[str, Any]:
        """As ``lint --json`` lists it."""
        return {"rule": self.name, "severity": self.severity, "where": self.where, "detail": self.detail, "fix": self.fix}


__all__ = ["Check", "STATUSES", "SEVERITY_OF_STATUS", "STATUS_OF_SEVERITY"]
