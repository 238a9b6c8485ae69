"""Capacity planning from a config alone: does it fit a NeuronCore, at which TP degree, and how fast can it be.

Formulas (all bytes; ``b`` = bytes per element of the dtype):

* Device weights per core = (replicated parameters + sharded parameters / tp) x b, counted by
  :func:`neuron_port.parallel.per_core.device_params_per_core` (q/o and MLP split by tp, k/v by the
  KV heads each rank holds, the LM head replicated; embedding tables stay on the host unless
  asked otherwise). Real parameter counts, never "effective" ones. ``quant="int8"`` (weight-only,
  per output channel): the projections at one byte plus an fp32 scale per output channel on the
  core; norms and the LM head stay at b. ``quant="int8+head"``: the LM head at one byte too, with
  an fp32 scale per vocabulary row.
* A second graph: neuronx-distributed's ModelBuilder keeps one set of weights for all its keys
  (its NxDModel runs every bucket model over the same weights), which is the device path this
  library targets at every degree, and the CPU artifacts hold one weights file per rank; so the
  default is x1. ``graphs_share_weights=False`` (``plan --separate-weights``) plans for graphs
  that each carry their own copy (x2: separately traced ``torch_neuronx.trace`` graphs, each
  loading its weights; the field report's E4B overflow on one core), and the plan says so when
  that would change the recommended degree.
* KV store = the runtime's own accounting (:func:`neuron_port.graph.kv.kv_store_spec`): owners only, sliding
  owners as rings of the window, per rank at its local KV-head count.
* Other = a runtime reserve (``RUNTIME_RESERVE``) plus the largest activation working set
  (prefill bucket x max(2 x intermediate, q + 2 kv widths) x 4 B, and the logits row).
* Host RAM: full server = every parameter at b plus ``HOST_PROCESS_OVERHEAD``; slim server =
  the embedding tables only plus the overhead.
* Compile host RAM = tp x (per-core device weights at the plan's dtype) x ``COMPILER_EXPANSION``
  + every parameter at b x ``HOST_BUILD_COPIES`` (the model the build loads, plus what tracing
  every graph key adds on the host: measured at 2.0x the weight bytes by
  ``benchmarks/nxd_build_memory.py``, against 5.6x when each key deep-copied the model; measured
  on an E2B-shaped model with four keys, where the tables are a large share: NxD's parallel layers
  allocate every key's projections anew, so a model that is mostly projections adds more per key).
  ``COMPILER_EXPANSION`` is calibrated on the one anchor there is (a bf16 E4B TP=2 compile peaked
  past 128 GB and needed >= 55 GB of swap); the factor reproduces that swap figure, other sizes
  extrapolate from the single point.
* Roofline decode = per-core HBM bandwidth / bytes each core reads per token: its weights, read
  once, plus the K/V every attending layer reads at the context length
  (:meth:`~neuron_port.graph.kv.KVStoreSpec.attended_bytes` with
  :meth:`~neuron_port.model.layout.Layout.kv_readers`: a layer that shares another's K/V reads it
  too, so sharing saves memory, not traffic; a sliding layer reads its window). The same minimum
  ``backends.hlo_cost`` sets a compiled decode step against. Ranks read in parallel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_port.graph.kv import kv_store_spec, naive_kv_bytes
from neuron_port.model.layout import Layout
from neuron_port.model.quant import QUANT_SCHEMES
from neuron_port.parallel.per_core import core_params, rank0_kv_heads
from neuron_port.parallel.sharding import plan_model, valid_model_tp

GiB = 1 << 30
RUNTIME_RESERVE = GiB // 2
HOST_PROCESS_OVERHEAD = 2 * GiB
COMPILER_EXPANSION = 13.8  # E4B TP=2 bf16 on a 128 GiB host -> ~55 GB of swap (field report)
COMPILE_RAM_SOURCE = ("extrapolated from one field figure (a bf16 E4B compile at tp 2 peaked past 128 GB); "
                      "an order of magnitude, not a measurement of this model")
"""Where the compile-RAM figure comes from and how far to trust it: said wherever the figure is printed."""
HOST_BUILD_COPIES = 3.0  # the model, plus 2.0x its weight bytes while ModelBuilder traces every key
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class Target:
    name: str
    cores: int
    hbm_per_core: int
    hbm_bw_per_core: float  # bytes/s
    host_ram: int

    @classmethod
    def parse(cls, text: str) -> Target:
        """A known instance name or ``custom:cores=2,hbm_gib=16,bw_gbs=820,host_gib=64`` (bw per chip)."""
        if text in TARGETS:
            return TARGETS[text]
        if text.startswith("custom:"):
            fields = dict(kv.split("=", 1) for kv in text[len("custom:"):].split(",") if kv)
            try:
                cores = int(fields["cores"])
                return cls(text, cores, int(float(fields["hbm_gib"]) * GiB),
                           float(fields["bw_gbs"]) * 1e9 / cores, int(float(fields["host_gib"]) * GiB))
            except (KeyError, ValueError) as exc:
                raise ValueError(f"custom target {text!r}: expected cores, hbm_gib, bw_gbs, host_gib ({exc})") from None
        raise ValueError(
            f"unknown target {text!r}; expected one of {sorted(TARGETS)} or custom:cores=..,hbm_gib=..,bw_gbs=..,host_gib=.."
        )


# One Inferentia2 chip: 2 NeuronCores, 32 GiB HBM (16 per core), ~820 GB/s per chip.
TARGETS = {
    "inf2.xlarge": Target("inf2.xlarge", 2, 16 * GiB, 410e9, 16 * GiB),
    "inf2.8xlarge": Target("inf2.8xlarge", 2, 16 * GiB, 410e9, 128 * GiB),
}

# Measured decode rates (facts.md section 3): (shipped name, tp) -> (tok/s, what was measured).
MEASURED = {
    ("gemma-4-e2b", 1): (44.0, "1 core, two graphs, static KV 512/128 (field report)"),
    ("gemma-4-e2b", 2): (72.7, "TP=2, 2048/512 on inf2.8xlarge"),
    ("gemma-4-e4b", 2): (36.0, "TP=2, device prefill, bf16: ~36-39 tok/s (field report)"),
    ("gemma-4-12b", 2): (15.0, "TP=2, device prefill, 256/64 (field report)"),
}


@dataclass
class Plan:
    model: str
    target: str
    dtype: str
    quant: str
    tp: int
    recommended_tp: int | None
    fits: bool
    per_core_bytes: dict[str, int]
    kv_bytes: int
    kv_bytes_owners_full_length: int
    kv_bytes_naive: int
    kv_read_bytes_per_token: int
    host_ram_bytes: dict[str, int]
    compile_host_ram_bytes: int
    swap_recommended_bytes: int
    compile_host_ram_source: str
    roofline_tok_per_s: float
    measured_tok_per_s: float | None
    measured_note: str | None
    params: dict[str, int]
    context: int
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Sizing:
    """What every per-core figure depends on besides the degree."""

    layout: Layout
    config: Any
    target: Target
    dtype_bytes: int
    context: int
    buckets: tuple[int, ...]
    batch: int
    embeddings_on_device: bool
    graphs_share_weights: bool
    quant: str = "none"

    def per_core(self, t: int) -> dict[str, int]:
        """Bytes one core holds at tp ``t``: weights, a second graph's weights, KV, other."""
        layout, b = self.layout, self.dtype_bytes
        weights = core_params(layout, self.config, t, self.embeddings_on_device).weight_bytes(b, self.quant)
        share = self.graphs_share_weights
        kv = kv_store_spec(layout, self.context, kv_heads=rank0_kv_heads(layout, t)).total_bytes(self.batch, b)
        widest = max(max(2 * s.intermediate_size // t, (s.n_q + 2 * s.n_kv) * s.head_dim) for s in layout.layers)
        activations = self.batch * max(self.buckets) * widest * 4 + self.batch * layout.vocab_size * 4
        return {"weights": weights, "second_graph": 0 if share else weights, "kv": kv, "other": RUNTIME_RESERVE + activations}

    def fits(self, t: int) -> bool:
        return sum(self.per_core(t).values()) <= self.target.hbm_per_core


def _fit_reasons(sizing: _Sizing, chosen: int, cores: dict[str, int], ok: bool, recommended: int | None) -> list[str]:
    """Why tp 1 does not fit (when it does not), what the chosen degree takes, and no-fit."""
    target, p, reasons = sizing.target, sizing.layout.params, []
    if chosen != 1 or not sizing.fits(1):
        one = sizing.per_core(1)
        if sum(one.values()) > target.hbm_per_core:
            reasons.append(
                f"tp 1 does not fit: {sum(one.values()) / GiB:.1f} GiB per core needed "
                f"(weights {one['weights'] / GiB:.1f} + second graph {one['second_graph'] / GiB:.1f} + KV {one['kv'] / GiB:.2f} "
                f"+ other {one['other'] / GiB:.2f}) > {target.hbm_per_core / GiB:.0f} GiB; the model has "
                f"{p.total / 1e9:.2f} B real parameters ({p.transformer / 1e9:.2f} B in the transformer) — plan from these, "
                "not from the marketed 'effective' size"
            )
    reasons.append(
        f"tp {chosen}: {sum(cores.values()) / GiB:.2f} GiB per core of {target.hbm_per_core / GiB:.0f} GiB "
        f"({'fits' if ok else 'does not fit'}); prefill and decode "
        f"{'share one set of weights' if cores['second_graph'] == 0 else 'each carry the weights (separate traces)'}"
    )
    if recommended is None:
        reasons.append(f"no tp up to {target.cores} cores fits {target.name}")
    other = dataclasses.replace(sizing, graphs_share_weights=not sizing.graphs_share_weights)
    valid = [t for t in valid_model_tp(sizing.layout) if t <= target.cores]
    other_tp = next((t for t in valid if other.fits(t)), None)
    if other_tp != recommended:
        how = (
            "with one set of weights shared by both graphs (ModelBuilder; plan without --separate-weights)"
            if other.graphs_share_weights
            else "with graphs that each carry their own weights (separate traces; plan --separate-weights)"
        )
        found = (
            f"{other_tp}: {sum(other.per_core(other_tp).values()) / GiB:.2f} GiB per core"
            if other_tp is not None
            else f"none: no tp up to {target.cores} cores fits"
        )
        reasons.append(f"{how} the recommended tp would be {found}")
    return reasons


def _host_figures(
    layout: Layout, b: int, chosen: int, cores: dict[str, int], target: Target
) -> tuple[dict[str, int], int, int, list[str]]:
    """Host RAM of a full and a slim server, compile RAM and swap, with the reasons they raise."""
    p, reasons = layout.params, []
    full_bytes = p.total * b + HOST_PROCESS_OVERHEAD
    slim_bytes = (p.embedding + p.per_layer_embedding) * b + HOST_PROCESS_OVERHEAD
    compile_ram = int(chosen * cores["weights"] * COMPILER_EXPANSION + p.total * b * HOST_BUILD_COPIES)
    swap = max(0, compile_ram - target.host_ram)
    if swap:
        reasons.append(
            f"compiling at tp {chosen} may need ~{compile_ram / 1e9:.0f} GB of host RAM ({COMPILE_RAM_SOURCE}): "
            f"add >= {swap / 1e9:.0f} GB of swap"
        )
    if slim_bytes > target.host_ram:
        reasons.append(f"even a slim server needs {slim_bytes / GiB:.1f} GiB of host RAM > {target.host_ram / GiB:.0f} GiB")
    elif full_bytes > target.host_ram:
        reasons.append(
            f"a full server needs {full_bytes / GiB:.1f} GiB of host RAM > {target.host_ram / GiB:.0f} GiB: use the slim server"
        )
    return {"full": full_bytes, "slim": slim_bytes}, compile_ram, swap, reasons


def plan_capacity(
    layout: Layout,
    config: Any,
    model_name: str,
    target: Target,
    dtype: str = "bf16",
    tp: int | None = None,
    context: int = 2048,
    buckets: tuple[int, ...] = (128,),
    batch: int = 1,
    embeddings_on_device: bool = False,
    graphs_share_weights: bool = True,
    quant: str = "none",
) -> Plan:
    """The capacity plan at ``tp`` (or at the recommended degree when ``tp`` is None).

    ``graphs_share_weights``: prefill and decode hold one set of weights (ModelBuilder; the CPU
    artifacts); False plans for graphs that each carry their own copy (separate traces)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, found {dtype!r}")
    if quant not in QUANT_SCHEMES:
        raise ValueError(f"quant must be one of {QUANT_SCHEMES}, found {quant!r}")
    b = DTYPE_BYTES[dtype]
    sizing = _Sizing(layout, config, target, b, context, tuple(buckets), batch, embeddings_on_device, graphs_share_weights,
                     quant)
    valid = [t for t in valid_model_tp(layout) if t <= target.cores]
    recommended = next((t for t in valid if sizing.fits(t)), None)
    chosen = tp if tp is not None else (recommended or (valid[-1] if valid else 1))
    if tp is not None and tp not in valid_model_tp(layout):
        plan_model(layout, tp)  # raises the sharding error with the valid degrees
    cores = sizing.per_core(chosen)
    used = sum(cores.values())
    ok = used <= target.hbm_per_core and chosen <= target.cores
    host, compile_ram, swap, host_reasons = _host_figures(layout, b, chosen, cores, target)
    measured = MEASURED.get((model_name, chosen))
    rank_store = kv_store_spec(layout, context, kv_heads=rank0_kv_heads(layout, chosen))
    kv_read = rank_store.attended_bytes(context, batch, b, layout.kv_readers())
    return Plan(
        model=model_name,
        target=target.name,
        dtype=dtype,
        quant=quant,
        tp=chosen,
        recommended_tp=recommended,
        fits=ok,
        per_core_bytes={**cores, "total": used, "capacity": target.hbm_per_core},
        kv_bytes=rank_store.total_bytes(batch, b) * chosen,
        kv_bytes_owners_full_length=kv_store_spec(layout, context, ring_buffers=False).total_bytes(batch, b),
        kv_bytes_naive=naive_kv_bytes(layout, context, batch, b),
        kv_read_bytes_per_token=kv_read,
        host_ram_bytes=host,
        compile_host_ram_bytes=compile_ram,
        swap_recommended_bytes=swap,
        compile_host_ram_source=COMPILE_RAM_SOURCE,
        roofline_tok_per_s=round(target.hbm_bw_per_core / (cores["weights"] + kv_read), 1),
        measured_tok_per_s=measured[0] if measured else None,
        measured_note=measured[1] if measured else None,
        params=asdict(layout.params),
        context=context,
        reasons=_fit_reasons(sizing, chosen, cores, ok, recommended) + host_reasons,
    )


def expected_tokens_per_step(acceptance: float, draft_tokens: int) -> float:
    """Tokens one verify step of ``draft_tokens`` drafts makes on average when each draft is kept with probability
    ``acceptance`` once the ones before it were: ``1 + a + ... + a^k`` (the target's own token, then the kept run)."""
    if not 0.0 <= acceptance <= 1.0 or draft_tokens < 0:
        raise ValueError(f"an acceptance rate in [0, 1] and 0 or more drafted tokens, found {acceptance} and "
                         f"{draft_tokens}")
    return sum(acceptance ** i for i in range(draft_tokens + 1))


def speculative_roofline(plan: Plan, target: Target, draft_tokens: int, acceptances: Sequence[float],
                         drafter_step_bytes: int = 0) -> dict[str, Any]:
    """Decode tok/s per core with speculative decoding, from the plan's own per-core figures: a verify step of
    ``draft_tokens + 1`` rows reads the weights once and the K/V once (every row's query meets the same store) as a
    decode step does, plus ``drafter_step_bytes`` per drafted token (the drafter's weights and the K/V it reads; 0
    for prompt lookup); it makes :func:`expected_tokens_per_step` tokens. Compute is left out (a decode step is bound
    by bytes; ``k + 1`` rows stay far below the matmul peak)."""
    decode_bytes = plan.per_core_bytes["weights"] + plan.kv_read_bytes_per_token
    verify_bytes = decode_bytes + draft_tokens * drafter_step_bytes
    decode_rate = target.hbm_bw_per_core / decode_bytes
    rows = []
    for a in acceptances:
        tokens = expected_tokens_per_step(a, draft_tokens)
        rate = tokens * target.hbm_bw_per_core / verify_bytes
        rows.append({"acceptance": a, "tokens_per_step": round(tokens, 4), "tok_per_s": round(rate, 1),
                     "speedup": round(rate / decode_rate, 3)})
    return {"draft_tokens": draft_tokens, "decode_step_bytes": decode_bytes, "verify_step_bytes": verify_bytes,
            "decode_tok_per_s": round(decode_rate, 1), "rows": rows}


def format_capacity_plan(plan: Plan) -> str:
    c = plan.per_core_bytes
    mib = 1 << 20
    lines = [
        f"{plan.model} on {plan.target}, {plan.dtype}{f', {plan.quant} weights' if plan.quant != 'none' else ''}, "
        f"tp {plan.tp} (recommended {plan.recommended_tp}), context {plan.context}",
        f"  per core: weights {c['weights'] / GiB:6.2f} GiB | second graph {c['second_graph'] / GiB:6.2f} GiB | "
        f"KV {c['kv'] / mib:8.1f} MiB | other {c['other'] / GiB:5.2f} GiB | "
        f"total {c['total'] / GiB:6.2f} of {c['capacity'] / GiB:.0f} GiB"
        f" -> {'FITS' if plan.fits else 'DOES NOT FIT'}",
        f"  KV store: {plan.kv_bytes / mib:.1f} MiB (owners, rings) vs {plan.kv_bytes_owners_full_length / mib:.1f} MiB "
        f"(owners, full length) vs {plan.kv_bytes_naive / mib:.1f} MiB (every layer, full length)",
        f"  host RAM: full {plan.host_ram_bytes['full'] / GiB:.1f} GiB, slim {plan.host_ram_bytes['slim'] / GiB:.1f} GiB; "
        f"compile ~{plan.compile_host_ram_bytes / 1e9:.0f} GB (swap >= {plan.swap_recommended_bytes / 1e9:.0f} GB; "
        "extrapolated from one field figure: an order of magnitude)",
        f"  roofline decode {plan.roofline_tok_per_s:.1f} tok/s (weights + {plan.kv_read_bytes_per_token / mib:.1f} MiB "
        f"of K/V read per step per core); "
        + (f"field figure {plan.measured_tok_per_s} tok/s ({plan.measured_note}; not measured by this library)"
           if plan.measured_tok_per_s else "no field figure"),
    ]
    lines += [f"  - {r}" for r in plan.reasons]
    return "\n".join(lines)


def save_chart(plan: Plan, path: str) -> None:
    """PNG bar chart of the per-core memory breakdown (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--png needs matplotlib: pip install 'neuron-port[plot]'") from None
    c = plan.per_core_bytes
    parts = [("weights", c["weights"]), ("second graph", c["second_graph"]), ("KV", c["kv"]), ("other", c["other"])]
    fig, ax = plt.subplots(figsize=(7, 2.6))
    left = 0.0
    for name, value in parts:
        ax.barh([0], [value / GiB], left=left, label=f"{name} {value / GiB:.2f} GiB")
        left += value / GiB
    ax.axvline(c["capacity"] / GiB, color="black", linestyle="--", label=f"core HBM {c['capacity'] / GiB:.0f} GiB")
    ax.set_yticks([])
    ax.set_xlabel("GiB per NeuronCore")
    ax.set_title(f"{plan.model} {plan.dtype} tp {plan.tp} on {plan.target}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = [
    "expected_tokens_per_step",
    "speculative_roofline",
    "Target",
    "TARGETS",
    "Plan",
    "plan_capacity",
    "format_capacity_plan",
    "save_chart",
    "MEASURED",
]
