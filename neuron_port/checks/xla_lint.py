"""Findings from how the graphs lower through torch-xla (``neuron-port lint MODEL --xla``).

The tiny variant is ported through the XLA backend (:mod:`neuron_port.backends.xla_port`), generates a
few tokens past its sliding window, and the lowering report becomes findings:

* more uncached compiles than graph shapes: something changes the graph from step to step (a
  Python value baked into the trace, a shape that varies), so every step compiles again;
* an aten fallback: an op XLA cannot lower ran on the CPU, outside the graph (a host round trip
  per step on a device);
* a KV store not aliased: its tensors are copied in and out of every step instead of staying
  resident on the device;
* an HLO op the Neuron compiler is documented not to take (control flow), or a dynamically sized
  dimension (see :mod:`neuron_port.backends.hlo_text` for the sources);
* a graph that ran but whose HLO was not seen (it compiled earlier in the same process): a clean
  report is only claimed for what was observed;
* a warning when the decode step moves more than ``DECODE_COST_BOUND`` times the least a decode step
  at its KV length must (weights, attended K/V, new rows: the report's ``decode_cost``). 1.3 is the
  bound the port is held to at long contexts on E2B: past it, on a device whose decode is bound by
  HBM traffic, more than a quarter of each step's time goes to bytes no decode step needs.

Numbers per graph (instructions, collectives, aliased buffers, compile seconds) are reported as
they are; only the rules above are findings.
"""

from __future__ import annotations

from typing import Any

from neuron_port.backends.hlo_text import DYNAMIC_SHAPE_NOTE, NEURON_REJECTED_OPCODES
from neuron_port.checks.check import Check

LINT_TOKENS = 20
DECODE_COST_BOUND = 1.3


def findings_of(report: dict[str, Any]) -> list[Check]:
    """The findings of a lowering report (``XlaBackend.report()``)."""
    found: list[Check] = []
    if report["uncached_compiles"] > report["graphs"]:
        found.append(Check.finding("xla-recompiles", "error", "generation",
                             f"{report['uncached_compiles']} uncached compiles for {report['graphs']} graph shapes",
                             "keep every per-step value a tensor input (embeddings, positions, lengths); nothing read from a "
                             "Python scalar may change the traced graph"))
    for op, count in sorted(report["fallback_ops"].items()):
        found.append(Check.finding("xla-fallback", "error", op, f"ran {count} times on the CPU outside the graph",
                             "replace the op with one XLA lowers, or move it to the host side of the step"))
    for name, kv in sorted(report["kv_tensors"].items()):
        if name not in report["aliased_buffers"]:
            found.append(Check.finding("xla-not-observed", "error", name, "the graph ran but its HLO was not seen (compiled "
                                 "earlier in this process, or XLA's dumps are off)", "check it in a fresh process"))
            continue
        aliased = report["aliased_buffers"][name]
        if aliased < kv:
            found.append(Check.finding("kv-not-aliased", "error", name, f"{aliased} of {kv} KV tensors aliased to outputs",
                                 "write the new K/V back into the store's own tensors so the store stays on the device"))
    for name, opcodes in sorted(report["hlo_opcodes"].items()):
        for op, why in sorted(NEURON_REJECTED_OPCODES.items()):
            if opcodes.get(op):
                found.append(Check.finding("neuron-rejected-hlo", "error", f"{name}: {op} x{opcodes[op]}", why,
                                     "make the graph straight-line: fixed loops unrolled, choices as masks or selects"))
        if report["dynamic_dimensions"].get(name):
            found.append(Check.finding("dynamic-shape", "error", name, f"{report['dynamic_dimensions'][name]} instructions: "
                                 f"{DYNAMIC_SHAPE_NOTE}", "pad to a bucket so every dimension is static"))
    cost = report.get("decode_cost")
    if cost is not None and cost["ratio"] > DECODE_COST_BOUND:
        biggest = max(cost["by_class"], key=cost["by_class"].get)
        found.append(Check.finding("decode-traffic", "warning", cost["graph"],
                                   f"a decode step moves {cost['bytes']:,} bytes, {cost['ratio']:.2f}x the least it must "
                                   f"({cost['minimum_bytes']:,}: weights, attended K/V, new rows; bound "
                                   f"{DECODE_COST_BOUND}); the most goes to {biggest}",
                                   "write only the new K/V rows (in-place updates), and read only the K/V the "
                                   "position attends"))
    return found


def lint_xla(name: str, tp: int = 1) -> dict[str, Any]:
    """Port the tiny variant of ``name`` through the XLA backend at ``tp`` and report its lowering."""
    from neuron_port.generation.generate import generate
    from neuron_port.generation.prompts import random_prompt
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.configs import load_config
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import build_model
    from neuron_port.parallel.ranks import RankSetup

    model = build_model(load_config(name, tiny=True), seed=0)
    layout = describe(model)
    length = min(32, 2 * (layout.sliding_window or 12))  # past the window: the rings wrap
    bos = layout.family.special_ids(layout.family.text_config_of(model)).bos
    request = GenerationRequest.greedy([random_prompt(layout.vocab_size, length, bos=bos)], LINT_TOKENS)
    # two KV lengths: the generation outgrows the first, so the store also grows on the device
    result = generate(model, request, shape=PortShape(32, (32, 64)), setup=RankSetup.for_layout(layout, tp), backend="xla")
    return lowering_result(f"{name} tiny", tp, result.lowering)


def lowering_result(what: str, tp: int, report: dict[str, Any]) -> dict[str, Any]:
    """A lowering report with its findings: what ``lint --xla --json`` prints."""
    found = findings_of(report)
    return {"model": what, "tp": tp, "xla": report, "findings": [f.to_finding() for f in found],
            "errors": sum(f.failed for f in found)}


def format_lowering(result: dict[str, Any]) -> str:
    """A table of the graphs' lowering, then the findings."""
    x = result["xla"]
    lines = [
        f"{result['model']}, tp {result['tp']} on {x['devices']} XLA device(s): {x['graphs']} graphs, "
        f"{x['uncached_compiles']} uncached / {x['cached_compiles']} cached compiles, fallbacks {x['fallback_ops'] or 'none'}",
        f"{'graph':<18}{'HLO instr':>10}{'all-reduce':>11}{'aliased/KV':>12}{'compile s':>10}",
    ]
    for graph, count in x["hlo_instructions"].items():
        kv = x["kv_tensors"].get(graph)
        aliased = f"{x['aliased_buffers'].get(graph, 0)}/{kv}" if kv is not None else "-"
        lines.append(
            f"{graph:<18}{count:>10}{x['hlo_opcodes'][graph].get('all-reduce', 0):>11}{aliased:>12}"
            f"{x['compile_s'].get(graph, 0):>10}"
        )
    cost = x.get("decode_cost")
    if cost is not None:
        lines.append(f"decode step ({cost['graph']}): {cost['bytes']:,} bytes moved per device, minimum "
                     f"{cost['minimum_bytes']:,}, ratio {cost['ratio']:.2f}")
    for f in result["findings"]:
        lines.append(f"[{f['severity']}] {f['rule']} at {f['where']}: {f['detail']}\n    fix: {f['fix']}")
    lines.append(f"{result['errors']} error(s)")
    return "\n".join(lines)


__all__ = ["LINT_TOKENS", "DECODE_COST_BOUND", "findings_of", "lint_xla", "lowering_result", "format_lowering"]
