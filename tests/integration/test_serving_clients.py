"""The standard load tools, unchanged, against ``neuron-port serve`` on the real SmolLM2-135M-Instruct.

guidellm 0.8.1 streams chat completions and always asks for vLLM's ``continuous_usage_stats`` (a server that
refuses it fails every request); at concurrency 1, 4 and 16 (over 4 slots: the rest queue) and at one Poisson
rate, no request may error, every request gets the tokens it asked for, and the server's ``/metrics`` then
holds the time-to-first-token and inter-token histograms with exactly the run's counts. aiperf 0.13.0 runs
where it is installed (its own virtualenv: ``AIPERF=/path/to/aiperf``).
"""

from __future__ import annotations

import re

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("guidellm")
from tests.helpers import ServerProcess  # noqa: E402
from tests.support.load_tools import aiperf_command, run_aiperf, run_guidellm  # noqa: E402

PROMPT_TOKENS, OUTPUT_TOKENS, REQUESTS = 24, 8, 16
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_server(smollm2_dir):
    srv = ServerProcess(str(smollm2_dir), "--max-batch", "4", "--buckets", "64,128", "--kv-lens", "256",
                        "--served-model-name", "smol", "--log-level", "warning", timeout=300)
    yield srv
    srv.stop()


def _sample(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    assert found, f"{name} is not in /metrics"
    return float(found.group(1))


def test_guidellm_streams_at_every_concurrency_and_a_poisson_rate_without_an_error(smol_server, smollm2_dir, tmp_path):
    points = run_guidellm(smol_server.base, smollm2_dir, tmp_path / "concurrent.json", "concurrent", [1, 4, 16],
                          REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS)
    points += run_guidellm(smol_server.base, smollm2_dir, tmp_path / "poisson.json", "poisson", [2.0],
                           REQUESTS // 2, PROMPT_TOKENS, OUTPUT_TOKENS)
    assert [(p["profile"], p["point"]) for p in points] == [("concurrent", 1), ("concurrent", 4), ("concurrent", 16),
                                                              ("poisson", 2.0)]
    for p in points:
        assert p["errored"] == 0 and p["incomplete"] == 0, p
        assert p["successful"] == (REQUESTS if p["profile"] == "concurrent" else REQUESTS // 2), p
        assert p["output_tokens"] == p["successful"] * OUTPUT_TOKENS, p  # the usage the server streamed
        assert p["ttft_p50_ms"] > 0 and p["itl_p50_ms"] > 0, p  # streamed token by token: guidellm saw each

    requests = sum(p["successful"] for p in points)
    text = httpx.get(smol_server.base + "/metrics").text
    assert _sample(text, "vllm:time_to_first_token_seconds_count") == requests
    assert _sample(text, "vllm:inter_token_latency_seconds_count") == requests * (OUTPUT_TOKENS - 1)
    assert _sample(text, "vllm:e2e_request_latency_seconds_count") == requests
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="smol",le="+Inf"}' in text
    assert "unknown parameter" not in smol_server.output()


@pytest.mark.skipif(aiperf_command() is None, reason="aiperf 0.13.0 lives in its own virtualenv: set AIPERF to run it")
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_aiperf_runs_chat_and_completions_without_an_error(smol_server, smollm2_dir, tmp_path, endpoint):
    for concurrency in (1, 8):
        summary = run_aiperf(smol_server.base, "smol", smollm2_dir, tmp_path / f"{endpoint}-{concurrency}", endpoint,
                             concurrency, 8, PROMPT_TOKENS, OUTPUT_TOKENS)
        assert summary["errored"] == 0 and summary["successful"] == 8, summary
