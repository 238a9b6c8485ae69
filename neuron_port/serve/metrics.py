"""Prometheus metrics of the server: request counts by route and status, tokens, latency, queue."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Metrics:
    """Counters and the latency histogram, updated from the event loop and the engine thread."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cancelled: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    latency_count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

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


def host_rss_bytes() -> int:
    """Resident memory of this process."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def render_metrics(m: Metrics, queue_depth: int, running: int) -> str:
    """The Prometheus text exposition of ``m`` plus the engine's queue depth and running count."""
    lines = ["# HELP neuron_port_requests_total HTTP requests by route and status.", "# TYPE neuron_port_requests_total counter"]
    for (route, status), n in sorted(m.requests.items()):
        lines.append(f'neuron_port_requests_total{{route="{route}",status="{status}"}} {n}')
    lines += [
        "# TYPE neuron_port_prompt_tokens_total counter", f"neuron_port_prompt_tokens_total {m.prompt_tokens}",
        "# TYPE neuron_port_generated_tokens_total counter", f"neuron_port_generated_tokens_total {m.generated_tokens}",
        "# TYPE neuron_port_cancelled_requests_total counter", f"neuron_port_cancelled_requests_total {m.cancelled}",
        "# HELP neuron_port_request_latency_seconds Time from request to last token.",
        "# TYPE neuron_port_request_latency_seconds histogram",
    ]
    for bound, n in zip(LATENCY_BUCKETS, m.latency):
        lines.append(f'neuron_port_request_latency_seconds_bucket{{le="{bound}"}} {n}')
    lines += [
        f'neuron_port_request_latency_seconds_bucket{{le="+Inf"}} {m.latency[-1]}',
        f"neuron_port_request_latency_seconds_sum {m.latency_sum:.6f}",
        f"neuron_port_request_latency_seconds_count {m.latency_count}",
        "# TYPE neuron_port_queue_depth gauge", f"neuron_port_queue_depth {queue_depth}",
        "# TYPE neuron_port_requests_running gauge", f"neuron_port_requests_running {running}",
        "# TYPE neuron_port_host_rss_bytes gauge", f"neuron_port_host_rss_bytes {host_rss_bytes()}",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["LATENCY_BUCKETS", "Metrics", "host_rss_bytes", "render_metrics"]
