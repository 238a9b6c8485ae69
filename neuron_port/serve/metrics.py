"""Prometheus metrics of the server: requests by route template and status, tokens, latency, queue.

Route labels come from the route that matched (its template, such as ``/v1/completions``); any
other path counts as ``unmatched``, so hostile or random paths add no series. Label values are
escaped as the text format requires. Every family has a HELP and a TYPE line.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# vLLM's bucket bounds for its time-to-first-token and inter-token histograms, so dashboards built for vLLM read ours
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# a request's share of drafted tokens the target kept (speculative decoding)
ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
UNMATCHED = "unmatched"
# (name, help): speculative decoding's counters, named as vLLM names them (label model_name)
SPECULATION_COUNTERS = {
    "drafts": ("vllm:spec_decode_num_drafts_total", "Verify steps of one request that checked at least one draft."),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "Drafted tokens checked by the target."),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total", "Drafted tokens the target emitted."),
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
COUNTERS = {
    "prompt_tokens": "Prompt tokens of accepted requests.",
    "generated_tokens": "Tokens generated.",
    "cancelled": "Requests whose client went away before the end.",
    "server_errors": "Responses with a 5xx status.",
}
# (name, help, bounds): the per-token histograms, named as vLLM names them (label model_name)
TOKEN_HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds", "Time from a request's arrival to its first token.", TTFT_BUCKETS),
    "itl": ("vllm:inter_token_latency_seconds", "Time between two tokens of one choice.", ITL_BUCKETS),
    "e2e": ("vllm:e2e_request_latency_seconds", "Time from a request's arrival to its last token.", TTFT_BUCKETS),
}


def route_label(scope: dict[str, Any]) -> str:
    """The matched route's template, or ``unmatched``."""
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED


def escape(value: str) -> str:
    """A label value escaped for the Prometheus text format (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Histogram:
    """A Prometheus histogram: per-bucket counts (not yet cumulative; the last is +Inf), their sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[next((i for i, bound in enumerate(self.bounds) if seconds <= bound), len(self.bounds))] += 1
        self.total += seconds
        self.count += 1

    def samples(self, name: str, labels: str = "") -> list[str]:
        """The ``_bucket`` (cumulative), ``_sum`` and ``_count`` lines; ``labels``: ``key="value"`` pairs or ''."""
        sep = "," if labels else ""
        running, lines = 0, []
        for bound, n in zip((*self.bounds, "+Inf"), self.counts, strict=True):
            running += n
            lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        braces = f"{{{labels}}}" if labels else ""
        return [*lines, f"{name}_sum{braces} {self.total:.6f}", f"{name}_count{braces} {self.count}"]


@dataclass
class Metrics:
    """Counters and histograms, updated from the event loop and the engine thread."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: {name: 0 for name in COUNTERS})
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    tokens: dict[str, Histogram] = field(default_factory=lambda: {key: Histogram(bounds) for key, (_, _, bounds)
                                                                  in TOKEN_HISTOGRAMS.items()})
    speculation: dict[str, int] = field(default_factory=lambda: {key: 0 for key in SPECULATION_COUNTERS})
    accepted_at: list[int] = field(default_factory=list)  # [position in the draft] drafted tokens kept there
    acceptance: Histogram = field(default_factory=lambda: Histogram(ACCEPTANCE_BUCKETS))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, counter: str, n: int) -> None:
        with self.lock:
            self.counters[counter] += n

    def observe(self, seconds: float) -> None:
        """A request's time from arrival to its last token."""
        with self.lock:
            self.latency.observe(seconds)
            self.tokens["e2e"].observe(seconds)

    def observe_token(self, key: str, seconds: float) -> None:
        """A time to first token (``ttft``) or between two tokens (``itl``)."""
        with self.lock:
            self.tokens[key].observe(seconds)

    def speculated(self, drafted: int, accepted: int) -> None:
        """One verify step of one request: ``drafted`` tokens checked, its first ``accepted`` kept."""
        if not drafted:
            return
        with self.lock:
            self.speculation["drafts"] += 1
            self.speculation["draft_tokens"] += drafted
            self.speculation["accepted_tokens"] += accepted
            self.accepted_at += [0] * (accepted - len(self.accepted_at))
            for position in range(accepted):
                self.accepted_at[position] += 1

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        """A finished request's drafted tokens and those kept, as its acceptance rate (none without drafts)."""
        if drafted:
            with self.lock:
                self.acceptance.observe(accepted / drafted)

    def count(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
            if status >= 500:
                self.counters["server_errors"] += 1


def host_rss_bytes() -> int:
    """Resident memory of this process."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _family(name: str, kind: str, help_text: str, samples: list[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def _speculation_lines(counts: dict[str, int], accepted_at: list[int], acceptance: Histogram, label: str) -> list[str]:
    """Speculative decoding's vLLM-named counters, the tokens kept at each draft position, and the per-request
    acceptance rate (all zero when the server does not speculate)."""
    lines: list[str] = []
    for key, (name, help_text) in SPECULATION_COUNTERS.items():
        lines += _family(name, "counter", help_text, [f"{name}{{{label}}} {counts[key]}"])
    lines += _family(PER_POSITION, "counter", "Drafted tokens the target emitted, by their position in the draft.",
                     [f'{PER_POSITION}{{{label},position="{i}"}} {n}' for i, n in enumerate(accepted_at)])
    name = "neuron_port_request_draft_acceptance_rate"
    return lines + _family(name, "histogram", "A finished request's drafted tokens the target emitted, as a share.",
                           acceptance.samples(name, label))


def render_metrics(m: Metrics, queue_depth: int, running: int, model_name: str = "") -> str:
    """The Prometheus text exposition of ``m`` plus the engine's queue depth and running count;
    ``model_name`` labels the vLLM-named families."""
    with m.lock:
        requests = sorted(m.requests.items())
        counters = dict(m.counters)
        latency = Histogram(m.latency.bounds, list(m.latency.counts), m.latency.total, m.latency.count)
        tokens = {key: Histogram(h.bounds, list(h.counts), h.total, h.count) for key, h in m.tokens.items()}
        speculation, accepted_at = dict(m.speculation), list(m.accepted_at)
        acceptance = Histogram(m.acceptance.bounds, list(m.acceptance.counts), m.acceptance.total, m.acceptance.count)
    lines = _family("neuron_port_requests_total", "counter", "HTTP requests by route template and status.",
                    [f'neuron_port_requests_total{{route="{escape(route)}",status="{status}"}} {n}'
                     for (route, status), n in requests])
    for key, help_text in COUNTERS.items():
        name = f"neuron_port_{key}_total" if key != "cancelled" else "neuron_port_cancelled_requests_total"
        lines += _family(name, "counter", help_text, [f"{name} {counters[key]}"])
    lines += _family("neuron_port_request_latency_seconds", "histogram", "Time from request to last token.",
                     latency.samples("neuron_port_request_latency_seconds"))
    label = f'model_name="{escape(model_name)}"'
    for key, (name, help_text, _) in TOKEN_HISTOGRAMS.items():
        lines += _family(name, "histogram", help_text, tokens[key].samples(name, label))
    lines += _speculation_lines(speculation, accepted_at, acceptance, label)
    lines += _family(
        "neuron_port_queue_depth", "gauge", "Requests waiting for a slot.", [f"neuron_port_queue_depth {queue_depth}"]
    )
    lines += _family(
        "neuron_port_requests_running", "gauge", "Requests decoding now.", [f"neuron_port_requests_running {running}"]
    )
    lines += _family(
        "neuron_port_host_rss_bytes",
        "gauge",
        "Resident memory of the server process.",
        [f"neuron_port_host_rss_bytes {host_rss_bytes()}"],
    )
    return "\n".join(lines) + "\n"


__all__ = ["ACCEPTANCE_BUCKETS", "SPECULATION_COUNTERS", "PER_POSITION",
           "LATENCY_BUCKETS", "TTFT_BUCKETS", "ITL_BUCKETS", "TOKEN_HISTOGRAMS", "UNMATCHED", "COUNTERS", "Histogram",
           "Metrics", "route_label", "escape", "host_rss_bytes", "render_metrics"]
