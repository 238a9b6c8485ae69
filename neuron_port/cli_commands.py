"""Subcommands beyond ``describe``: each registers itself with :mod:`neuron_port.cli`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from neuron_port.cli import register
from neuron_port.errors import NeuronPortError
from neuron_port.families import family_for, family_of


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, found {text!r}")
    return values


# ---- shard-plan ------------------------------------------------------------------------------
def _cmd_shard_plan(args: argparse.Namespace) -> int:
    from neuron_port.configs import load_config
    from neuron_port.layout import describe
    from neuron_port.sharding import format_plan, plan_model

    layout = describe(load_config(args.model, tiny=args.tiny))
    plan = plan_model(layout, args.tp)
    if args.json:
        _print_json({"model": args.model, "model_type": layout.model_type, **plan.to_json()})
    else:
        print(format_plan(plan))
    return 0


@register
def _add_shard_plan(sub) -> None:
    p = sub.add_parser("shard-plan", help="tensor-parallel plan: which heads and KV heads every rank holds")
    p.add_argument("model")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_shard_plan)


# ---- port ------------------------------------------------------------------------------------
class PromptError(NeuronPortError, ValueError):
    pass


def _prompt_ids(args: argparse.Namespace, source: str, vocab: int, bos: int | None) -> list[int]:
    """``--prompt TEXT`` tokenised with ``source``'s tokenizer.json, or ``--prompt-len`` seeded
    random ids; BOS first when the family has one."""
    import torch

    if args.prompt is not None:
        from neuron_port.tokenizer import load_tokenizer

        tok = load_tokenizer(source)
        if tok is None:
            raise PromptError(
                f"--prompt TEXT needs a tokenizer.json in {source}; it has none. "
                "Use --prompt-len N for random prompt tokens."
            )
        return ([bos] if bos is not None else []) + tok.encode(args.prompt).ids
    gen = torch.Generator().manual_seed(args.seed + 1000)
    ids = torch.randint(3, vocab, (args.prompt_len,), generator=gen).tolist()
    if bos is not None:
        ids[0] = bos
    return ids


def _divergence(tokens: list[int], reference: list[int], ref_logits) -> dict | None:
    """First divergence of the port from the reference, classified as near-tie or error."""
    from dataclasses import asdict

    from neuron_port.oracle import classify_divergence, compare_tokens

    cmp = compare_tokens(tokens, reference)
    if cmp.match:
        return None
    i = cmp.first_divergence
    if i < len(tokens) and i < len(ref_logits):
        return asdict(classify_divergence(i, tokens[i], ref_logits[i]))
    return {"index": i, "kind": "length differs"}


def _emit_generation(out: dict[str, Any], args: argparse.Namespace) -> int:
    """Print a generation result (JSON or key: value lines, plus SEQ_MATCH with --check); the exit code."""
    if args.json:
        _print_json(out)
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
        if args.check:
            print(f"SEQ_MATCH {out['seq_match']}")
    return 0 if (not args.check or out["seq_match"]) else 1


def _cmd_port(args: argparse.Namespace) -> int:
    from neuron_port.models import model_from_name
    from neuron_port.oracle import reference_generate
    from neuron_port.run import GenerationJob, generate_with_port, naive_bytes_for

    if args.backend != "cpu":
        from neuron_port.backends import require_backend

        require_backend(args.backend)
    from pathlib import Path

    model = model_from_name(args.model, tiny=args.tiny, seed=args.seed)
    family = family_of(model)
    config = family.text_config_of(model)
    special = family.special_ids(config)
    real_weights = Path(args.model).is_dir()
    # A random-weight model's end-of-sequence token is noise: stop on it only for real weights.
    stop_on_eos = real_weights if args.stop_at_eos is None else args.stop_at_eos
    stop_ids = list(special.eos) if stop_on_eos else []
    prompt = _prompt_ids(args, args.model, family.vocab_size(config), special.bos)
    prompts = [prompt[: max(1, len(prompt) - 3 * row)] for row in range(args.batch)]
    job = GenerationJob(prompts, args.max_new_tokens, args.buckets, args.kv_len, stop_ids)
    result = generate_with_port(model, job, tp=args.tp)
    out: dict[str, Any] = {
        "model": args.model,
        "tiny": args.tiny,
        "backend": args.backend,
        "tp": args.tp,
        "batch": args.batch,
        "prompt_tokens": len(prompt),
        "new_tokens": len(result["tokens"][0]),
        "tokens": result["tokens"][0],
        "finish_reason": result["finish_reasons"][0],
        "stop_ids": stop_ids,
        "kv_cache_bytes": result["kv_cache_bytes"],
        "kv_cache_bytes_naive": naive_bytes_for(model, args.kv_len, args.batch, result["dtype_bytes"]),
        "prefill_s": round(result["prefill_s"], 6),
        "decode_tok_per_s": result["decode_tok_per_s"],
        "host_ms_per_token": round(1e3 * result["host_s"] / max(1, result["decode_steps"] + 1), 4),
    }
    if args.tp > 1:
        out["per_rank_kv_cache_bytes"] = result["per_rank_kv_cache_bytes"]
    if args.batch > 1:
        out["rows"] = [{"prompt_tokens": len(p), "tokens": t} for p, t in zip(prompts, result["tokens"])]
    if args.check:
        matches = []
        for row, p in enumerate(prompts):
            ref = reference_generate(model, p, args.max_new_tokens, stop_ids)
            matches.append(result["tokens"][row] == ref["tokens"])
            if row == 0:
                out["reference_tokens"] = ref["tokens"]
                out["divergence"] = _divergence(result["tokens"][0], ref["tokens"], ref["logits"])
            if args.batch > 1:
                out["rows"][row]["reference_tokens"] = ref["tokens"]
                out["rows"][row]["seq_match"] = matches[-1]
        out["seq_match"] = all(matches)
    return _emit_generation(out, args)


@register
def _add_port(sub) -> None:
    p = sub.add_parser("port", help="build the two-graph port and generate (optionally check against HF generate)")
    p.add_argument("model", help="a shipped name or a local model directory (config.json + safetensors)")
    p.add_argument("--tiny", action="store_true", help="random weights on the tiny variant")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (gloo ranks on this machine)")
    p.add_argument("--backend", default="cpu", choices=["cpu", "neuron", "nxd"])
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prompt-len", type=int, default=24, help="random prompt of N tokens (BOS first)")
    group.add_argument("--prompt", default=None, help="prompt text (needs tokenizer.json in the model directory)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and the random prompt")
    p.add_argument("--buckets", type=_int_list, default=[32, 64, 128], help="prompt buckets, e.g. 32,64,128")
    p.add_argument("--kv-len", type=int, default=256, help="KV length of the store (full-attention slots)")
    p.add_argument("--batch", type=int, default=1, help="rows decoded together (prompts of different lengths)")
    eos = p.add_mutually_exclusive_group()
    eos.add_argument("--stop-at-eos", dest="stop_at_eos", action="store_true", default=None,
                     help="stop at the end-of-sequence token (default for real weights)")
    eos.add_argument("--ignore-eos", dest="stop_at_eos", action="store_false",
                     help="never stop at end-of-sequence (default for random weights)")
    p.add_argument("--check", action="store_true", help="compare with Hugging Face generate (greedy) on CPU")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_port)


# ---- compile / generate ----------------------------------------------------------------------
def _cmd_compile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from neuron_port.backends import require_backend
    from neuron_port.compiled import compile_artifact
    from neuron_port.models import load_source

    if args.backend in ("neuron", "nxd"):
        require_backend(args.backend)
    model, source = load_source(args.model, tiny=args.tiny, seed=args.seed)
    tok_dir = args.model if Path(args.model).is_dir() else None
    manifest = compile_artifact(model, args.out, source, args.buckets, args.kv_lens, args.tp, args.backend,
                                args.batch, tok_dir)
    summary = {k: manifest[k] for k in ("backend", "tp", "buckets", "kv_lens", "batch", "weights_fingerprint")}
    summary["out"] = str(Path(args.out).resolve())
    summary["files"] = len(manifest["files"])
    if args.json:
        _print_json(summary)
    else:
        print(f"artifact written to {summary['out']} ({summary['files']} files, backend {args.backend}, tp {args.tp})")
    return 0


@register
def _add_compile(sub) -> None:
    p = sub.add_parser("compile", help="compile the two graphs into a verified artifact directory")
    p.add_argument("model")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--backend", default="cpu", choices=["cpu", "neuron", "nxd"])
    p.add_argument("--out", required=True, help="artifact directory (written atomically)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--buckets", type=_int_list, default=[32, 64, 128])
    p.add_argument("--kv-lens", type=_int_list, default=[256], help="KV lengths, e.g. 128,256")
    p.add_argument("--batch", type=int, default=1, help="batch size the graphs are compiled for")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_compile)


def _cmd_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from neuron_port.artifact import verify
    from neuron_port.compiled import generate_from_artifact, reference_model
    from neuron_port.configs import load_config
    from neuron_port.oracle import reference_generate

    manifest = verify(args.dir, args.allow_version_mismatch)
    config = load_config(Path(args.dir) / "config.json")
    family = family_for(config.model_type)
    special = family.special_ids(config)
    prompt = _prompt_ids(args, args.dir, family.vocab_size(config), special.bos)
    stop_ids = list(special.eos) if args.stop_at_eos else []
    result = generate_from_artifact(args.dir, [prompt], args.max_new_tokens, stop_ids, manifest=manifest)
    out: dict[str, Any] = {
        "artifact": str(Path(args.dir).resolve()),
        "backend": manifest["backend"],
        "tp": manifest["tp"],
        "prompt_tokens": len(prompt),
        "new_tokens": len(result["tokens"][0]),
        "tokens": result["tokens"][0],
        "finish_reason": result["finish_reasons"][0],
        "prefill_s": round(result["prefill_s"], 6),
        "decode_tok_per_s": result["decode_tok_per_s"],
    }
    if args.check:
        ref = reference_generate(reference_model(manifest), prompt, args.max_new_tokens, stop_ids)
        out["reference_tokens"] = ref["tokens"]
        out["divergence"] = _divergence(out["tokens"], ref["tokens"], ref["logits"])
        out["seq_match"] = out["tokens"] == ref["tokens"]
    return _emit_generation(out, args)


@register
def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="run a compiled artifact from its directory alone (fresh process)")
    p.add_argument("dir")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prompt-len", type=int, default=24)
    group.add_argument("--prompt", default=None)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    p.add_argument("--stop-at-eos", action="store_true")
    p.add_argument("--check", action="store_true", help="compare with HF generate on the artifact's own checkpoint")
    p.add_argument("--allow-version-mismatch", action="store_true",
                   help="run even if the installed torch / Neuron versions differ from the artifact's")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_generate)


# ---- plan / lint -----------------------------------------------------------------------------
def _cmd_plan(args: argparse.Namespace) -> int:
    from neuron_port.configs import load_config
    from neuron_port.layout import describe
    from neuron_port.planner import Target, format_plan, plan_capacity, save_chart

    config = load_config(args.model, tiny=args.tiny)
    plan = plan_capacity(describe(config), config, args.model, Target.parse(args.target), args.dtype, args.tp,
                         args.context, tuple(args.buckets), args.batch, args.embeddings_on_device)
    if args.png:
        save_chart(plan, args.png)
    if args.json:
        _print_json(plan.to_json())
    else:
        print(format_plan(plan))
    return 0


@register
def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="capacity plan: bytes per core, recommended TP, host RAM, roofline decode rate")
    p.add_argument("model")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--target", default="inf2.xlarge", help="inf2.xlarge | inf2.8xlarge | custom:cores=2,hbm_gib=16,bw_gbs=820,host_gib=64")
    p.add_argument("--tp", type=int, default=None, help="plan at this degree (default: the recommended one)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--context", type=int, default=2048, help="KV length")
    p.add_argument("--buckets", type=_int_list, default=[128])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--embeddings-on-device", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--png", default=None, help="write a per-core memory chart (needs matplotlib)")
    p.set_defaults(func=_cmd_plan)


def _cmd_lint(args: argparse.Namespace) -> int:
    from neuron_port.lint import lint_model

    report = lint_model(args.model, softcap_in_graph=args.softcap_in_graph)
    if args.json:
        _print_json(report)
    else:
        for f in report["findings"]:
            print(f"[{f['severity']}] {f['rule']} at {f['where']}: {f['detail']}\n    fix: {f['fix']}")
        print(f"{report['errors']} error(s)")
    return 0


@register
def _add_lint(sub) -> None:
    p = sub.add_parser("lint", help="Neuron-hostile ops and SBUF overflows in the exported graphs, before compiling")
    p.add_argument("model", help="a shipped name or a local config (the tiny variant's graphs are traced)")
    p.add_argument("--softcap-in-graph", action="store_true", help="lint the graph with the softcap left on the device")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_lint)


# ---- doctor ----------------------------------------------------------------------------------
def _cmd_doctor(args: argparse.Namespace) -> int:
    from neuron_port.doctor import format_report, report, run_doctor

    checks = run_doctor(args.dir, tokens=args.tokens)
    if args.json:
        _print_json(report(checks))
    else:
        print(format_report(checks))
    return 0 if report(checks)["ok"] else 1


@register
def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="triage a model or artifact directory, cheapest check first")
    p.add_argument("dir", help="a model directory (config.json, safetensors, tokenizer) or an artifact directory")
    p.add_argument("--tokens", type=int, default=8, help="greedy tokens compared with the CPU reference")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_doctor)


# ---- serve -----------------------------------------------------------------------------------
def _cmd_serve(args: argparse.Namespace) -> int:
    import functools

    try:
        from neuron_port.serve import build_app, load_served, serve
    except ImportError as exc:  # pragma: no cover - the serve extra is missing
        raise PromptError(f"serving needs the 'serve' extra: pip install 'neuron-port[serve]' ({exc})") from None

    load = functools.partial(load_served, args.model, tiny=args.tiny, seed=args.seed, slim=args.slim,
                             max_batch=args.max_batch, max_queue=args.max_queue, buckets=tuple(args.buckets),
                             kv_lens=tuple(args.kv_lens))
    serve(build_app(load, api_key=args.api_key), host=args.host, port=args.port)
    return 0


@register
def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the 'serve' extra)")
    p.add_argument("model", help="a shipped name, a model directory or an artifact directory")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--slim", action="store_true", help="keep only embeddings and compiled graphs on the host")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests beyond this get 429")
    p.add_argument("--max-batch", type=int, default=4, help="requests decoded together (static batching)")
    p.add_argument("--buckets", type=_int_list, default=[32, 64, 128])
    p.add_argument("--kv-lens", type=_int_list, default=[256, 512])
    p.set_defaults(func=_cmd_serve)
