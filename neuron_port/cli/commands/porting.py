"""``port``: build the two graphs of every rank over a model and generate, optionally checked against Hugging Face."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from neuron_port.cli.commands.common import (
    MODEL_HELP,
    add_dtype_option,
    add_model_source_options,
    add_prompt_options,
    add_speculation_options,
    emit_generation,
    int_list,
    prompt_from_args,
    speculation_report,
    text_stream,
)
from neuron_port.cli.quant_flags import add_quant_option

if TYPE_CHECKING:
    from neuron_port.checks.checked_run import CheckedRun


def _cmd_port(args: argparse.Namespace) -> int:
    from neuron_port.backends import backend_spec, check_backend_tp, require_backend
    from neuron_port.checks.checked_run import CheckedRun
    from neuron_port.generation.generate import generate
    from neuron_port.generation.opened import OpenedModel
    from neuron_port.generation.prompts import staggered_prompts
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.graph.kv import naive_kv_bytes
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import model_from_name, parse_dtype
    from neuron_port.parallel.ranks import RankSetup

    spec = backend_spec(args.backend)
    check_backend_tp(args.backend, args.tp)
    _refuse_speculation(args)
    require_backend(args.backend)  # before any model is built: one line naming the SDK it needs
    if not spec.in_process:
        from neuron_port.errors import NeuronPortError

        raise NeuronPortError(spec.refusal)
    if args.backend == "xla":
        from neuron_port.backends.xla import require_xla

        require_xla()  # before any model is built: one line saying how to install it
    opened = OpenedModel.open(args.model, tiny=args.tiny)
    drafter = _drafter(args, opened.config)  # read and checked against the target before the target is built
    model = model_from_name(args.model, tiny=args.tiny, seed=args.seed, dtype=parse_dtype(args.dtype), quant=args.quant,
                            config=opened.config)
    setup = RankSetup.for_layout(describe(model), args.tp)
    stop_ids = opened.stop_ids(args.chat is not None, stop_at_eos=args.stop_at_eos)
    prompt = prompt_from_args(args, opened)
    prompts = staggered_prompts(prompt, args.batch)
    layout = setup.layout
    draft_tokens = args.draft_tokens if args.speculate else 0
    shape = PortShape(args.buckets, args.kv_len, draft_tokens=draft_tokens)
    request = GenerationRequest.greedy(prompts, args.max_new_tokens, stop_ids, keep_logits=args.check,
                                       draft_tokens=draft_tokens)
    stream = text_stream(args, opened)  # the answer as it comes, for a person reading a text prompt's
    result = generate(model, request, shape=shape, setup=setup, backend="xla" if args.backend == "xla" else "eager",
                      tokenizer=stream.tokenizer if stream else None, on_token=stream, drafter=drafter)
    out: dict[str, Any] = {
        "model": args.model, "tiny": args.tiny, "backend": args.backend, "tp": args.tp, "batch": args.batch,
        "dtype": args.dtype,
        "quant": args.quant,
        "prompt_tokens": len(prompt),
        "new_tokens": len(result.tokens[0]),
        "tokens": result.tokens[0],
        "finish_reason": result.finish_reasons[0],
        "stop_ids": stop_ids,
        "kv_cache_bytes": result.kv_cache_bytes,
        "kv_cache_bytes_naive": naive_kv_bytes(layout, args.kv_len, args.batch, result.dtype_bytes),
        "prefill_s": round(result.prefill_s, 6),
        "decode_tok_per_s": result.decode_tok_per_s,
        "host_ms_per_token": round(1e3 * result.host_s / max(1, result.decode_steps + 1), 4),
    }
    if args.tp > 1:
        out["per_rank_kv_cache_bytes"] = [s.specs[args.kv_len].total_bytes(args.batch, result.dtype_bytes)
                                          for s in shape.rank_stores(setup)]
    if result.lowering is not None:
        out["xla"] = result.lowering
        out["decode_cost"] = result.lowering["decode_cost"]  # bytes a decode step moves per device, against its minimum
    if args.speculate:
        out["speculation"] = _speculation(args, result)
    if args.batch > 1:
        out["rows"] = [{"prompt_tokens": len(p), "tokens": t} for p, t in zip(prompts, result.tokens, strict=True)]
    if opened.real_weights and (args.prompt is not None or args.chat is not None):
        out["text"] = opened.decode(result.tokens[0], stop_ids)
    checked = CheckedRun(run=out)
    if args.check:
        _check_run(checked, model, setup, shape, prompts, result, args, stop_ids, opened.real_weights)
    return emit_generation(checked, args, stream)


def _refuse_speculation(args: argparse.Namespace) -> None:
    """What ``--speculate`` cannot do yet, said before any model is built."""
    from neuron_port.errors import NeuronPortError

    if args.draft is not None and args.speculate != "assistant":
        raise NeuronPortError(f"--draft names the drafter of --speculate assistant, found "
                              f"{f'--speculate {args.speculate}' if args.speculate else 'no --speculate'}")
    if not args.speculate:
        return
    if args.draft_tokens < 1:
        raise NeuronPortError(f"--draft-tokens is 1 or more with --speculate, found {args.draft_tokens}")
    if args.speculate == "assistant" and args.draft is None and not args.tiny:
        raise NeuronPortError("--speculate assistant needs the drafter's directory: --draft DIR (a random one only with "
                              "--tiny)")
    if args.speculate == "assistant" and args.tp != 1:
        raise NeuronPortError(f"--speculate assistant reads the whole KV store of one port: --tp 1, found --tp {args.tp}")
    if args.backend not in ("cpu", "xla") or (args.backend == "xla" and args.speculate == "assistant"):
        raise NeuronPortError(f"--speculate runs its verify graphs on the cpu backend or through torch-xla (ngram only: "
                              f"the drafter runs eagerly); found --backend {args.backend} with --speculate "
                              f"{args.speculate}: drop --speculate or use --backend cpu")
    if args.check:
        raise NeuronPortError("--check compares every step's logits, which verify steps do not keep yet: check the "
                              "port without --speculate, then compare the texts (speculation keeps greedy output)")


def _drafter(args: argparse.Namespace, config: Any) -> Any:
    """The drafter of ``--speculate assistant``: loaded from ``--draft`` and checked against the target's config, or a
    tiny random one (``--tiny``); None otherwise."""
    if args.speculate != "assistant":
        return None
    from neuron_port.model.drafter import build_drafter, load_drafter

    return load_drafter(args.draft, config) if args.draft is not None else build_drafter(config, seed=args.seed + 1)


def _speculation(args: argparse.Namespace, result) -> dict[str, Any]:
    """What speculation did: drafted and kept tokens, the acceptance rate, and tokens per target step."""
    drafter = (args.draft or "tiny, random weights") if args.speculate == "assistant" else None
    return speculation_report(args.speculate, args.draft_tokens, result, drafter)


def _check_run(checked: CheckedRun, model, setup, shape, prompts: list[list[int]], result, args: argparse.Namespace,
               stop_ids: list[int], is_dir: bool) -> None:
    """Every row's tokens against Hugging Face generate, and what greedy tokens cannot see (row 0): the
    loader, host embeddings, the attention function inside the graphs, every step's logits after the
    softcap, and a quantized port's drift from the float32 model.

    The oracle: Hugging Face's own loading of a directory, float32 (never this library's loader), its
    projections quantized as the port's are: the port must compute what that model computes."""
    from neuron_port.checks.reference import reference_for_source
    from neuron_port.checks.selfcheck import (
        check_quant_drift,
        logit_tolerance_for,
        model_self_checks,
        tokens_must_match,
    )
    from neuron_port.checks.validation import compare_with_reference

    fp32_shipped = not is_dir and args.dtype == "fp32"
    reference = model if fp32_shipped else reference_for_source(args.model, tiny=args.tiny, seed=args.seed,
                                                                quant=args.quant)
    checked.row_matches = [compare_with_reference(tokens, reference, prompt, args.max_new_tokens, stop_ids)
                           for prompt, tokens in zip(prompts, result.tokens, strict=True)]
    checked.match = checked.row_matches[0]
    tolerance = (logit_tolerance_for(args.backend, args.dtype) if args.logit_tolerance is None
                 else args.logit_tolerance)
    checked.checks, checked.logits = model_self_checks(model, setup, shape, prompts[0], result.tokens[0],
                                                       result.step_logits, tolerance, reference=reference)
    checked.tokens_must_match = tokens_must_match(args.backend, args.dtype)
    if args.quant != "none":  # what the quantization costs: the same steps against the float32 model
        check, checked.quant = check_quant_drift(reference_for_source(args.model, tiny=args.tiny, seed=args.seed),
                                                 prompts[0], result.tokens[0], result.step_logits, args.quant,
                                                 judged=is_dir)
        checked.checks.append(check)


def add(sub) -> None:
    p = sub.add_parser("port", help="build the two-graph port and generate (optionally check against HF generate)")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--tiny", action="store_true", help="random weights on the tiny variant of a config")
    add_model_source_options(p, weights=True)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (gloo ranks on this machine)")
    p.add_argument("--backend", default="cpu", choices=["cpu", "neuron", "xla"],
                   help="cpu: eager graphs (gloo ranks at tp > 1); xla: through torch-xla (PJRT_DEVICE=CPU, SPMD at "
                        "tp > 1) with a lowering report; neuron: refused here, the Neuron path is an artifact "
                        "(compile --backend neuron|nxd)")
    add_prompt_options(p, default_tokens=48)
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and the random prompt")
    p.add_argument("--buckets", type=int_list, default=[32, 64, 128], help="prompt buckets, e.g. 32,64,128")
    p.add_argument("--kv-len", type=int, default=256, help="KV length of the store (full-attention slots)")
    p.add_argument("--batch", type=int, default=1, help="rows decoded together (prompts of different lengths)")
    eos = p.add_mutually_exclusive_group()
    eos.add_argument("--stop-at-eos", dest="stop_at_eos", action="store_true", default=None,
                     help="stop at the end-of-sequence token (default for real weights)")
    eos.add_argument("--ignore-eos", dest="stop_at_eos", action="store_false",
                     help="never stop at end-of-sequence (default for random weights)")
    add_speculation_options(p, "cpu backend, or xla for ngram; tp 1 for assistant")
    p.add_argument("--check", action="store_true", help="compare with Hugging Face generate (greedy) on CPU and run "
                   "the self-checks (host embeddings, attention function, every step's logits)")
    p.add_argument("--logit-tolerance", type=float, default=None,
                   help="--check: largest step logit error allowed, relative to the largest reference logit "
                        "(default: neuron_port.checks.selfcheck.logit_tolerance_for the dtype: 1e-3 for fp32, the "
                        "measured bf16 bound for bf16)")
    add_dtype_option(p, "of the graphs, weights and KV store")
    add_quant_option(p)
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of lines for people")
    p.set_defaults(func=_cmd_port)


__all__ = ["add"]
