"""``doctor``: triage a model or artifact directory, cheapest check first."""

from __future__ import annotations

import argparse

from neuron_port.cli.commands.common import print_json


def _cmd_doctor(args: argparse.Namespace) -> int:
    from neuron_port.checks.doctor import format_doctor_report, report, run_doctor

    checks = run_doctor(args.dir, tokens=args.tokens)
    if args.json:
        print_json(report(checks))
    else:
        print(format_doctor_report(checks))
    return 0 if report(checks)["ok"] else 1


def add(sub) -> None:
    p = sub.add_parser("doctor", help="triage a model or artifact directory, cheapest check first")
    p.add_argument("dir", help="a model directory (config.json, safetensors, tokenizer) or an artifact directory")
    p.add_argument("--tokens", type=int, default=8, help="greedy tokens compared with the CPU reference")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of lines for people")
    p.set_defaults(func=_cmd_doctor)


__all__ = ["add"]
