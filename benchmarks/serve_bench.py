"""The server as the field measures it: guidellm 0.8.1, unchanged, against ``neuron-port serve``.

For each model (the real SmolLM2-135M-Instruct, fp32; the tiny Gemma-4 E2B), in one run:

* **one stream, every slot or one**: a server with ``--max-batch 1`` and one with ``--max-batch 8``, each driven by
  one guidellm stream: the inter-token latency (ITL) p50 of the 8-slot server over the 1-slot one. With decode by
  occupancy a lone request runs the 1-row graph, so the ratio should sit near 1 (before: 1.6-1.8 on SmolLM2).
* **continuous against static admission**, ``--max-batch 8`` each: a concurrency sweep (1, 2, 4, 8, 16
  streams) and a Poisson rate sweep, requests asking for 1 to 2x the mean output length (a fixed length is
  static admission's best case: a batch whose requests all end at the same step wastes nothing); per point
  TTFT p50/p99, ITL p50/p99 and output tokens per second (over the point's wall time), and the ratios
  static / continuous for TTFT p50 and continuous / static for tokens per second. Half the slots (4 streams)
  is the point to read: static admission makes each new request wait for a whole batch to finish.

guidellm drives the server open-loop at its rates and closed-loop at its concurrencies, streams chat
completions with ``continuous_usage_stats`` and sends ``ignore_eos`` so every request gets the tokens it asks for.
This replaces ``serve_load.py`` (our own closed-loop client, whose ratios its workload capped): the field
measures with guidellm and aiperf, and the server is now tested against them (``tests/integration/
test_serving_clients.py``). Speeds are this machine's; run it on a quiet one.

    python benchmarks/serve_bench.py --json
    python benchmarks/serve_bench.py --models tiny-e2b --smoke --json     # seconds (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import ServerProcess  # noqa: E402
from tests.support.load_tools import GUIDELLM_VERSION, run_guidellm  # noqa: E402

MODELS = ("smollm2", "tiny-e2b")
SLOTS = 8


def model_args(name: str) -> tuple[list[str], Path]:
    """The serve arguments of a model and the tokenizer directory guidellm counts tokens with."""
    from neuron_port.model.pretrained import pretrained_dir

    if name == "smollm2":
        path = pretrained_dir("smollm2-135m")
        return [str(path), "--buckets", "64,128", "--kv-lens", "256"], path
    if name == "tiny-e2b":
        from neuron_port.model.configs import load_config
        from neuron_port.model.loading import build_model
        from neuron_port.model.localdir import write_model_dir

        path = Path(tempfile.mkdtemp(prefix="serve-bench-e2b-")) / "gemma-4-e2b-tiny"
        write_model_dir(build_model(load_config("gemma-4-e2b", tiny=True), seed=0), path)
        return [str(path), "--buckets", "64,128", "--kv-lens", "256"], path
    raise SystemExit(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")


def _serve(args: list[str], slots: int, batching: str) -> ServerProcess:
    return ServerProcess(*args, "--max-batch", str(slots), "--batching", batching, "--served-model-name", "bench",
                         "--log-level", "warning", timeout=900)


def _run(srv: ServerProcess, tokenizer: Path, work: Path, tag: str, profile: str, points: list[float], requests: int,
         prompt_tokens: int, output_tokens: int, output_stdev: int = 0) -> list[dict]:
    return run_guidellm(srv.base, tokenizer, work / f"{tag}.json", profile, points, requests, prompt_tokens, output_tokens,
                        output_stdev=output_stdev)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def bench_model(name: str, smoke: bool, work: Path, slim: bool = False, streams: list[int] | None = None,
                rates: list[float] | None = None, requests: int | None = None) -> dict:
    args, tokenizer = model_args(name)
    args += ["--slim"] if slim else []
    prompt_tokens, output_tokens = (16, 8) if smoke else (48, 32)
    spread = output_tokens // 2  # the sweeps' requests ask for 1 to 2x the mean, as a real mix does
    streams = streams or ([1, 4] if smoke else [1, 2, 4, 8, 16])
    rates = rates or ([1.0] if smoke else [0.5, 1.0, 2.0])
    requests = requests or (4 if smoke else 16)
    one_stream: dict[str, dict] = {}
    srv = _serve(args, 1, "continuous")  # one client: does it pay for the idle slots? (8 slots: below)
    try:
        one_stream["1"] = _run(srv, tokenizer, work, f"{name}-one-1", "concurrent", [1], requests, prompt_tokens,
                               output_tokens)[0]
    finally:
        srv.stop()
    sweeps: dict[str, list[dict]] = {}
    for batching in ("continuous", "static"):
        srv = _serve(args, SLOTS, batching)
        try:
            if batching == "continuous":
                one_stream[str(SLOTS)] = _run(srv, tokenizer, work, f"{name}-one-{SLOTS}", "concurrent", [1], requests,
                                              prompt_tokens, output_tokens)[0]
            points = _run(srv, tokenizer, work, f"{name}-{batching}-c", "concurrent", streams,
                          max(requests, 2 * max(streams)), prompt_tokens, output_tokens, spread)
            points += _run(srv, tokenizer, work, f"{name}-{batching}-p", "poisson", rates, requests, prompt_tokens,
                           output_tokens, spread)
            sweeps[batching] = points
        finally:
            srv.stop()
    ratios = []
    for cont, stat in zip(sweeps["continuous"], sweeps["static"], strict=True):
        ratios.append({"profile": cont["profile"], "point": cont["point"],
                       "ttft_p50_static_over_continuous": _ratio(stat["ttft_p50_ms"], cont["ttft_p50_ms"]),
                       "tok_s_continuous_over_static": _ratio(cont["output_tok_s"], stat["output_tok_s"])})
    return {"model": name, "graphs": "TorchScript (--slim)" if slim else "eager", "slots": SLOTS,
            "prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "sweep_output_stdev": spread,
            "one_stream": {**one_stream, "itl_p50_8_over_1": _ratio(one_stream[str(SLOTS)]["itl_p50_ms"],
                                                                    one_stream["1"]["itl_p50_ms"])},
            "sweeps": sweeps, "ratios": ratios,
            "errored": sum(p["errored"] for points in sweeps.values() for p in points)
            + sum(p["errored"] for p in one_stream.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--smoke", action="store_true", help="two concurrencies, one rate, short requests")
    parser.add_argument("--slim", action="store_true", help="serve compiled TorchScript graphs (with their decode graphs "
                        "for 1, 2 and 4 rows) instead of the eager ones")
    parser.add_argument("--streams", default=None, help="the concurrency sweep, comma-separated (default: 1,2,4,8,16)")
    parser.add_argument("--rates", default=None, help="the Poisson sweep in requests/s, comma-separated (default: 0.5,1,2)")
    parser.add_argument("--requests", type=int, default=None, help="requests per point (default: 16, at least twice "
                        "the streams; --smoke 4)")
    parser.add_argument("--json", action="store_true", help="print the JSON only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as work:
        streams = [int(v) for v in args.streams.split(",")] if args.streams else None
        rates = [float(v) for v in args.rates.split(",")] if args.rates else None
        results = [bench_model(name, args.smoke, Path(work), args.slim, streams, rates, args.requests)
                   for name in args.models.split(",")]
    out = {"benchmark": "serve_bench", "tool": f"guidellm {GUIDELLM_VERSION}", "results": results}
    if not args.json:
        for r in results:
            print(f"{r['model']}: one stream ITL p50, 8 slots over 1: {r['one_stream']['itl_p50_8_over_1']}",
                  file=sys.stderr)
            for ratio in r["ratios"]:
                print(f"  {ratio['profile']} {ratio['point']}: TTFT p50 static/continuous "
                      f"{ratio['ttft_p50_static_over_continuous']}, tok/s continuous/static "
                      f"{ratio['tok_s_continuous_over_static']}", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
