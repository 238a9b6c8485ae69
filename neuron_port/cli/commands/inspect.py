"""``describe``, ``shard-plan``, ``plan`` and ``lint``: what a model is and what porting it takes, before any weights."""

from __future__ import annotations

import argparse

from neuron_port.cli.commands.common import int_list, print_json, rate_list
from neuron_port.cli.quant_flags import add_quant_option


def _cmd_describe(args: argparse.Namespace) -> int:
    from neuron_port.model.configs import load_config
    from neuron_port.model.layout import describe, format_table

    layout = describe(load_config(args.model, tiny=args.tiny))
    if args.json:
        print_json(layout.to_json())
    else:
        print(format_table(layout))
    return 0


def _cmd_shard_plan(args: argparse.Namespace) -> int:
    from neuron_port.model.configs import load_config
    from neuron_port.model.layout import describe
    from neuron_port.parallel.ranks import RankSetup
    from neuron_port.parallel.sharding import format_shard_plan

    layout = describe(load_config(args.model, tiny=args.tiny))
    plan = RankSetup.for_layout(layout, args.tp).plan
    if args.json:
        print_json({"model": args.model, "model_type": layout.model_type, **plan.to_json()})
    else:
        print(format_shard_plan(plan))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from neuron_port.model.configs import load_config
    from neuron_port.model.layout import describe
    from neuron_port.planner import Target, format_capacity_plan, plan_capacity, save_chart, speculative_roofline

    config = load_config(args.model, tiny=args.tiny)
    target = Target.parse(args.target)
    plan = plan_capacity(describe(config), config, args.model, target, args.dtype, args.tp,
                         args.context, tuple(args.buckets), args.batch, args.embeddings_on_device, not args.separate_weights,
                         args.quant)
    speculation = (speculative_roofline(plan, target, args.draft_tokens, args.acceptance, args.drafter_bytes)
                   if args.draft_tokens else None)
    if args.png:
        save_chart(plan, args.png)
    if args.json:
        print_json({**plan.to_json(), **({"speculation": speculation} if speculation else {})})
        return 0
    print(format_capacity_plan(plan))
    if speculation:
        print(f"  speculative decoding, {args.draft_tokens} drafts per verify step (the same bytes as a decode step"
              f"{f' + {args.drafter_bytes / (1 << 20):.1f} MiB per drafted token' if args.drafter_bytes else ''}): "
              + "; ".join(f"acceptance {r['acceptance']}: {r['tok_per_s']} tok/s ({r['speedup']}x)"
                          for r in speculation["rows"]))
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    if args.xla:
        return _lint_xla(args)
    from neuron_port.checks.lint import lint_model

    report = lint_model(args.model, softcap_in_graph=args.softcap_in_graph)
    if args.json:
        print_json(report)
    else:
        for f in report["findings"]:
            print(f"[{f['severity']}] {f['rule']} at {f['where']}: {f['detail']}\n    fix: {f['fix']}")
        traced = ", ".join(report["graphs_traced"]) or "none"
        print(f"{report['errors']} error(s); graphs traced (tiny variant): {traced}")
    return 0


def _lint_xla(args: argparse.Namespace) -> int:
    from neuron_port.backends.xla import require_xla
    from neuron_port.checks.xla_lint import format_lowering, lint_xla

    require_xla()
    result = lint_xla(args.model, tp=args.tp)
    if args.json:
        print_json(result)
    else:
        print(format_lowering(result))
    return 1 if result["errors"] else 0


CONFIG_HELP = "a Hugging Face id, a model directory, a config.json or a shipped name (only its config is read)"


def add(sub) -> None:
    p = sub.add_parser("describe", help="per-layer layout of a model: attention type, heads, KV owners, params")
    p.add_argument("model", help=CONFIG_HELP)
    p.add_argument("--tiny", action="store_true", help="the tiny variant with the same architectural features")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_describe)

    p = sub.add_parser("shard-plan", help="tensor-parallel plan: which heads and KV heads every rank holds")
    p.add_argument("model", help=CONFIG_HELP)
    p.add_argument("--tiny", action="store_true", help="the tiny variant with the same architectural features")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of lines for people")
    p.set_defaults(func=_cmd_shard_plan)

    p = sub.add_parser("plan", help="capacity plan: bytes per core, recommended TP, host RAM, roofline decode rate")
    p.add_argument("model", help=CONFIG_HELP)
    p.add_argument("--tiny", action="store_true", help="the tiny variant with the same architectural features")
    p.add_argument(
        "--target", default="inf2.xlarge", help="inf2.xlarge | inf2.8xlarge | custom:cores=2,hbm_gib=16,bw_gbs=820,host_gib=64"
    )
    p.add_argument("--tp", type=int, default=None, help="plan at this degree (default: the one it recommends)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="dtype of the device weights")
    add_quant_option(p, what="int8: weight-only, per output channel (projections at one byte plus fp32 scales; norms and "
                     "the LM head at --dtype, unless --quant-head)")
    p.add_argument("--context", type=int, default=2048, help="KV length")
    p.add_argument("--buckets", type=int_list, default=[128], help="prompt buckets (the prefill graphs' lengths)")
    p.add_argument("--batch", type=int, default=1, help="rows decoded together")
    p.add_argument("--embeddings-on-device", action="store_true",
                   help="count the word (and per-layer) embedding tables on the device instead of the host")
    p.add_argument(
        "--separate-weights",
        action="store_true",
        help="plan for graphs that each carry their own weights (separately traced graphs) instead "
        "of one set shared by every graph (neuronx-distributed's ModelBuilder, the default)",
    )
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of lines for people")
    p.add_argument("--png", default=None, help="write a per-core memory chart (needs matplotlib)")
    p.add_argument("--draft-tokens", type=int, default=0, metavar="K",
                   help="speculative decoding: the roofline tok/s with verify steps of K drafts (default 0: none)")
    p.add_argument("--acceptance", type=rate_list, default=[0.5, 0.7], metavar="A,...",
                   help="--draft-tokens: per-draft acceptance rates to model (default 0.5,0.7)")
    p.add_argument("--drafter-bytes", type=int, default=0, metavar="BYTES",
                   help="--draft-tokens: bytes a drafted token moves per core (a drafter's weights and the K/V it "
                        "reads; default 0, prompt lookup)")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("lint", help="Neuron-hostile ops and SBUF overflows in the exported graphs, before compiling")
    p.add_argument("model", help="a shipped name or a local config (the tiny variant's graphs are traced)")
    p.add_argument("--softcap-in-graph", action="store_true", help="lint the graph with the softcap left on the device")
    p.add_argument(
        "--xla",
        action="store_true",
        help="lower the tiny variant's graphs through torch-xla (PJRT_DEVICE=CPU) "
        "and report compiles, fallbacks, HLO op counts and KV aliasing",
    )
    p.add_argument("--tp", type=int, default=1, help="with --xla: SPMD over this many XLA CPU devices")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of lines for people")
    p.set_defaults(func=_cmd_lint)


__all__ = ["add"]
