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
UNMATCHED = "unmatched"
COUNTERS = {
    "prompt_tokens": "Prompt tokens of accepted requests.",
    "generated_tokens": "Tokens generated.",
    "cancelled": "Requests whose client went away before the end.",
    "server_errors": "Responses with a 5xx status.",
}


def route_label(scope: dict[str, Any]) -> str:
    """The matched route's template, or ``unmatched``."""
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED


def escape(value: str) -> str:
    """A label value escaped for the Prometheus text format (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Metrics:
    """Counters and the latency histogram, updated from the event loop and the engine thread."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: {name: 0 for name in COUNTERS})
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    latency_count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, counter: str, n: int) -> None:
        with self.lock:
            self.counters[counter] += n

    def observe(self, seconds: float) -> None:
        with self.lock:
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    self.latency[i] += 1
            self.latency[-1] += 1
            self.latency_sum += seconds
            self.latency_count += 1

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


def render_metrics(m: Metrics, queue_depth: int, running: int) -> str:
    """The Prometheus text exposition of ``m`` plus the engine's queue depth and running count."""
    with m.lock:
        requests = sorted(m.requests.items())
        counters = dict(m.counters)
        latency, total, count = list(m.latency), m.latency_sum, m.latency_count
    lines = _family("neuron_port_requests_total", "counter", "HTTP requests by route template and status.",
                    [f'neuron_port_requests_total{{route="{escape(route)}",status="{status}"}} {n}'
                     for (route, status), n in requests])
    for key, help_text in COUNTERS.items():
        name = f"neuron_port_{key}_total" if key != "cancelled" else "neuron_port_cancelled_requests_total"
        lines += _family(name, "counter", help_text, [f"{name} {counters[key]}"])
    buckets = [
        f'neuron_port_request_latency_seconds_bucket{{le="{bound}"}} {n}'
        for bound, n in zip(LATENCY_BUCKETS, latency, strict=False)
    ]
    lines += _family(
        "neuron_port_request_latency_seconds",
        "histogram",
        "Time from request to last token.",
        [
            *buckets,
            f'neuron_port_request_latency_seconds_bucket{{le="+Inf"}} {latency[-1]}',
            f"neuron_port_request_latency_seconds_sum {total:.6f}",
            f"neuron_port_request_latency_seconds_count {count}",
        ],
    )
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


__all__ = ["LATENCY_BUCKETS", "UNMATCHED", "COUNTERS", "Metrics", "route_label", "escape", "host_rss_bytes", "render_metrics"]
