"""How the port lowers through torch-xla, against Hugging Face ``generate`` on the same XLA device.

Needs torch-xla (its own virtualenv: torch 2.9 + torch-xla 2.9); runs on the CPU PJRT device.
Two parts, one JSON:

* ``tiny``: the tiny Gemma-4 E2B, 32 new tokens, both sides in this process on one XLA CPU
  device: the port (prefill + decode graphs, one sync per step, the KV store aliased) and Hugging
  Face ``generate`` with its static cache (``cache_implementation="static"``), each run twice
  (cold: with its compiles; warm: the same call again). Per side: uncached and cached compiles,
  aten fallbacks, HLO instructions of what it compiled (in all and per compile) and XLA's compile
  seconds, ms per new token; ratios HF / port.
* ``real_e2b``: the real-size E2B decode graph (35 layers, hidden 1536, random bf16 weights at the
  real shapes; embeddings stay on the host as always, so the per-layer embedding table is never
  made) lowered and run once at KV length ``--kv-len``: its HLO instruction count, compile
  seconds and the process's peak host RSS — what decides whether an inf2.xlarge host (16 GiB)
  can compile it. ``--smoke`` skips it.

    PJRT_DEVICE=CPU python benchmarks/xla_lowering.py --json
    PJRT_DEVICE=CPU python benchmarks/xla_lowering.py --smoke --json     # tiny only (CI)
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from neuron_port import describe, load_config
from neuron_port.backends.xla_port import xla_port
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model, init_nonpersistent_buffers
from neuron_port.parallel.ranks import RankSetup

PROMPT_LEN = 20


def _measured(recorder, name: str, run) -> dict:
    """Run ``run()`` (returns new tokens) under the backend's recorder: its compiles, cache hits,
    fallbacks, the HLO it compiled and the time per new token."""
    before, t0 = recorder.counters(), time.perf_counter()
    tokens = recorder.watch(name, run)
    seconds = time.perf_counter() - t0
    after = recorder.counters()
    out = {"uncached_compiles": after.get("UncachedCompile", 0) - before.get("UncachedCompile", 0),
           "cached_compiles": after.get("CachedCompile", 0) - before.get("CachedCompile", 0),
           "fallback_ops": {k: v - before.get(k, 0) for k, v in after.items() if k.startswith("aten::") and v > before.get(k, 0)},
           "ms_per_token": round(1e3 * seconds / len(tokens), 2), "tokens": tokens}
    compiled = recorder.graphs.get(name)
    if compiled and compiled["hlo"]:  # a warm run compiles nothing
        out.update(hlo_instructions_compiled=compiled["hlo"]["instructions"], compile_s=compiled["compile_s"],
                   hlo_instructions_per_compile=round(compiled["hlo"]["instructions"] / out["uncached_compiles"]))
    return out


def tiny_comparison(new_tokens: int) -> dict:
    import torch_xla

    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    prompt = [2] + list(range(30, 30 + PROMPT_LEN - 1))
    port, backend = xla_port(model, RankSetup.for_layout(describe(model), 1), PortShape(32, 64))
    recorder = backend.recorder
    port_runs = [
        _measured(recorder, f"port_{run}", lambda: generate(port, GenerationRequest.greedy([prompt], new_tokens)).tokens[0])
        for run in ("cold", "warm")
    ]
    hf = model.to(torch_xla.device())
    ids = torch.tensor([prompt]).to(torch_xla.device())

    def hf_generate():
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
                cache_implementation="static",
                pad_token_id=0,
                eos_token_id=None,
            )
        return out[0, len(prompt) :].tolist()

    hf_runs = [_measured(recorder, f"hf_{run}", hf_generate) for run in ("cold", "warm")]
    lowered = backend.report()  # the port's graphs were recorded by its own runners
    port_runs[0].update(
        hlo_instructions_compiled=sum(lowered["hlo_instructions"].get(g, 0) for g in ("prefill_32", "decode_64")),
        compile_s=round(sum(lowered["compile_s"].get(g, 0) for g in ("prefill_32", "decode_64")), 3),
        hlo_instructions_per_graph={g: lowered["hlo_instructions"][g] for g in ("prefill_32", "decode_64")},
    )
    same = port_runs[0].pop("tokens") == hf_runs[0].pop("tokens")
    for run in port_runs[1:] + hf_runs[1:]:
        run.pop("tokens")
    return {
        "new_tokens": new_tokens,
        "tokens_equal": same,
        "port": {"cold": port_runs[0], "warm": port_runs[1]},
        "hf_static_cache": {"cold": hf_runs[0], "warm": hf_runs[1]},
        "ratio_hf_over_port": {
            "uncached_compiles_cold": round(hf_runs[0]["uncached_compiles"] / max(1, port_runs[0]["uncached_compiles"]), 2),
            "ms_per_token_warm": round(hf_runs[1]["ms_per_token"] / port_runs[1]["ms_per_token"], 2),
        },
    }


def real_e2b_decode(kv_len: int) -> dict:
    """The real-size E2B decode graph, lowered and run once on the XLA device (bf16, random weights)."""
    import torch_xla

    from neuron_port.backends.xla import XlaBackend
    from neuron_port.graph.graphs import DecodeGraph
    from neuron_port.graph.host_inputs import HostInputs
    from neuron_port.model.loading import force_eager

    config = load_config("gemma-4-e2b")
    layout = describe(config)
    family = layout.family
    force_eager(config)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = family.causal_lm_class(config.model_type)(config)
    host_only = {id(family.word_embedding(model)), id(family.per_layer_embedding(model))}
    for module in model.modules():  # materialise every tensor but the host-only embedding tables
        if id(module) in host_only:  # a one-row stand-in: the graph never reads these tables
            module.weight = torch.nn.Parameter(
                torch.zeros((1, module.weight.shape[1]), dtype=torch.bfloat16), requires_grad=False
            )
            continue
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if not tensor.is_meta:
                continue
            real = (
                torch.randn(tensor.shape, dtype=torch.bfloat16) * 0.02
                if tensor.is_floating_point()
                else torch.zeros(tensor.shape, dtype=tensor.dtype)
            )
            setattr(
                module, name, torch.nn.Parameter(real, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else real
            )
    init_nonpersistent_buffers(model, config)  # RoPE tables and embedding scales, as transformers computes them
    stores = PortShape(1, kv_len).stores(layout)
    graph = DecodeGraph(model, stores.specs[kv_len])
    backend = XlaBackend()
    runner = backend.compile(graph, [], graph.aliases)
    ple_width = layout.num_layers * layout.per_layer_input_size
    embeddings = _ShapeOnlyEmbeddings(layout.hidden_size, layout.num_layers, layout.per_layer_input_size, ple_width)
    inputs = HostInputs(layout, stores, embeddings).decode_fresh(torch.tensor([3]), torch.tensor([kv_len - 1]))
    store = stores.specs[kv_len].allocate(1, torch.bfloat16)
    t0 = time.perf_counter()
    with torch.no_grad():
        runner(*[x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs], *store)
    report = backend.report()
    name = f"decode_{kv_len}"
    return {
        "kv_len": kv_len,
        "dtype": "bf16",
        "hlo_instructions": report["hlo_instructions"].get(name),
        "compile_s": report["compile_s"].get(name),
        "first_step_s": round(time.perf_counter() - t0, 2),
        "aliased_buffers": report["aliased_buffers"].get(name),
        "kv_tensors": report["kv_tensors"].get(name),
        "peak_host_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "inf2_xlarge_host_gib": 16,
        "devices": torch_xla.runtime.world_size(),
    }


class _ShapeOnlyEmbeddings:
    """Host embeddings of the right widths for one decode step (zeros: the lowering needs shapes, not tables)."""

    def __init__(self, hidden: int, num_layers: int, per_layer: int, ple_width: int):
        self.hidden, self.num_layers, self.per_layer = hidden, num_layers, per_layer
        self.word = torch.zeros((8, hidden), dtype=torch.bfloat16)
        self.ple = torch.zeros((8, ple_width), dtype=torch.bfloat16) if ple_width else None
        self.word_scale, self.ple_scale = None, torch.tensor(1.0, dtype=torch.bfloat16)

    def embed(self, ids: torch.Tensor):
        words = torch.zeros((*ids.shape, self.hidden), dtype=torch.bfloat16)
        return words, torch.zeros((*ids.shape, self.num_layers, self.per_layer), dtype=torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--kv-len", type=int, default=1024, help="KV length of the real-size decode graph")
    ap.add_argument("--smoke", action="store_true", help="tiny comparison only, 8 tokens")
    ap.add_argument("--parts", default="tiny,real_e2b", help="which parts to run: tiny, real_e2b or both")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    parts = ["tiny"] if args.smoke else args.parts.split(",")
    out = {"benchmark": "xla_lowering"}
    if "tiny" in parts:
        out["tiny"] = tiny_comparison(8 if args.smoke else args.tokens)
    if "real_e2b" in parts:
        out["real_e2b"] = real_e2b_decode(args.kv_len)
    print(json.dumps(out, indent=2 if args.json else None))


if __name__ == "__main__":
    main()
