"""The load tools the field measures a server with, driven unchanged: guidellm (in the ``bench`` extra) and aiperf
(its own virtualenv: aiperf 0.13.0 pins ``huggingface-hub<2``, which transformers 5.25 outgrew).

Each run returns one summary per benchmark point (a concurrency or a request rate), read from the tool's own JSON:
requests that succeeded, errored or were left incomplete, TTFT and inter-token latency p50 / p99 (ms) and output
tokens per second over the point's wall time. Used by ``tests/integration/test_serving_clients.py`` and
``benchmarks/serve_bench.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

GUIDELLM_VERSION = "0.8.1"
AIPERF_VERSION = "0.13.0"


def offline_env() -> dict[str, str]:
    """The environment for a load tool: nothing fetched from the Hugging Face hub, no telemetry."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def guidellm_command() -> list[str]:
    """guidellm's console script beside this Python (the ``bench`` extra installs it)."""
    script = Path(sys.executable).with_name("guidellm")
    return [str(script)] if script.exists() else ["guidellm"]


def _point_of_guidellm(bench: dict) -> dict:
    metrics, strategy = bench["metrics"], bench["config"]["strategy"]
    totals = metrics["request_totals"]

    def pct(name: str, p: str) -> float | None:
        values = metrics[name]["successful"]
        return values["percentiles"][p] if values.get("count") else None

    point = strategy.get("streams") if strategy["type_"] == "concurrent" else strategy.get("rate")
    out_tokens = metrics["output_token_count"]["successful"].get("total_sum") or 0.0
    return {"tool": "guidellm", "profile": strategy["type_"], "point": point,
            "successful": totals["successful"], "errored": totals["errored"], "incomplete": totals["incomplete"],
            "ttft_p50_ms": pct("time_to_first_token_ms", "p50"), "ttft_p99_ms": pct("time_to_first_token_ms", "p99"),
            "itl_p50_ms": pct("inter_token_latency_ms", "p50"), "itl_p99_ms": pct("inter_token_latency_ms", "p99"),
            "output_tokens": out_tokens, "output_tok_s": out_tokens / bench["duration"] if bench["duration"] else None}


def run_guidellm(base: str, tokenizer: Path, out: Path, profile: str, points: list[float], requests: int,
                 prompt_tokens: int, output_tokens: int, timeout: float = 900, output_stdev: int = 0) -> list[dict]:
    """``guidellm run`` against ``base`` (streamed chat completions, guidellm's defaults): ``profile``
    ``concurrent`` (``points``: streams) or ``poisson`` / ``constant`` (``points``: requests per second),
    ``requests`` per point, synthetic prompts of ``prompt_tokens`` tokens asking ``output_tokens`` new ones
    (guidellm then sends ``ignore_eos``; ``output_stdev``: lengths drawn around it, from 1 to twice it). Its JSON
    goes to ``out``; one summary per point."""
    key = "streams" if profile == "concurrent" else "rate"
    spread = (f",output_tokens_stdev={output_stdev},output_tokens_min=1,output_tokens_max={2 * output_tokens}"
              if output_stdev else "")
    values = ",".join(f"{p:g}" for p in points)
    command = [*guidellm_command(), "run", "--backend", f"kind=openai_http,target={base}",
               "--profile", f"kind={profile},{key}={points[0]:g}", "--override", f"profile.{key}", values,
               "--constraint", f"kind=max_requests,count={requests}",
               "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}" + spread,
               "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
               "--output", f"kind=json,path={out}", "--disable-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=offline_env())
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"guidellm exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    return [_point_of_guidellm(bench) for bench in json.loads(out.read_text())["benchmarks"]]


def aiperf_command() -> list[str] | None:
    """aiperf's console script: ``$AIPERF`` or ``aiperf`` on the PATH; None when neither is there."""
    found = os.environ.get("AIPERF") or shutil.which("aiperf")
    return [found] if found else None


def _aiperf_summary(records: dict, endpoint: str, concurrency: int) -> dict:
    def stat(name: str, key: str = "avg") -> float | None:
        return (records.get(name) or {}).get(key)

    return {"tool": "aiperf", "profile": endpoint, "point": concurrency,
            "successful": stat("completed_request_count") or 0,
            "errored": sum(int(entry.get("count", 1)) for entry in records.get("error_summary") or []),
            "ttft_p50_ms": stat("time_to_first_token", "p50"), "ttft_p99_ms": stat("time_to_first_token", "p99"),
            "itl_p50_ms": stat("inter_token_latency", "p50"), "itl_p99_ms": stat("inter_token_latency", "p99"),
            "output_tok_s": stat("output_token_throughput")}


def run_aiperf(base: str, model: str, tokenizer: Path, out_dir: Path, endpoint: str, concurrency: int, requests: int,
               prompt_tokens: int, output_tokens: int, timeout: float = 900) -> dict:
    """``aiperf profile`` against ``base`` (``endpoint``: ``chat`` or ``completions``, streamed), ``requests``
    requests at ``concurrency``; the summary of its JSON export."""
    command = aiperf_command()
    if command is None:
        raise RuntimeError(f"aiperf {AIPERF_VERSION} is not installed (set AIPERF to its console script)")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [*command, "profile", "--model", model, "--url", base, "--endpoint-type", endpoint, "--streaming",
            "--tokenizer", str(tokenizer), "--request-count", str(requests), "--concurrency", str(concurrency),
            "--prompt-input-tokens-mean", str(prompt_tokens), "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", str(output_tokens), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--artifact-dir", str(out_dir), "--ui-type", "none"]
    # not offline: aiperf's offline mode reads a tokenizer path as a hub id in the cache (and fails); a directory
    # path is read from disk either way, and nothing else is fetched
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=out_dir)
    exports = sorted(out_dir.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not exports:
        raise RuntimeError(f"aiperf exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    records = json.loads(exports[-1].read_text())
    return _aiperf_summary(records, endpoint, concurrency)


__all__ = ["GUIDELLM_VERSION", "AIPERF_VERSION", "offline_env", "guidellm_command", "run_guidellm", "aiperf_command",
           "run_aiperf"]
