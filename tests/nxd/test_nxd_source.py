"""The library's NxD layers and checkpoints on neuronx-distributed's real code (release 2.28.0).

What runs here, unmodified, from ``third_party/neuronx-distributed`` (the NxD source of Neuron
SDK 2.28, the release an inf2 host pins; ``SHA256SUMS`` lists every file and the first test
checks them): ``parallel_layers`` (ColumnParallelLinear, RowParallelLinear, their mappings and
collectives in ``NXD_CPU_MODE`` over gloo), ``parallel_state.initialize_model_parallel`` and
``trace.trace.get_sharded_checkpoint``. The Neuron compiler packages (``torch_neuronx``,
``neuronxcc``) are replaced by inert import-time stand-ins (:mod:`tests.nxd.nxd_stubs`) and the two
package ``__init__`` files that import ModelBuilder are skipped; none of that is on the path
the numbers below come from.

What does not run here and needs an inf2 host: ModelBuilder's trace and compile (HLO through
torch-neuronx to neuronx-cc), neffs, the Neuron runtime, device-resident KV.

Runs in the torch-xla virtualenv (NxD imports torch_xla at module level); CI's second stage.
"""


from __future__ import annotations

import hashlib
import socket
import sys
from pathlib import Path

import pytest

from tests.nxd import nxd_stubs

pytestmark = [pytest.mark.xla, pytest.mark.slow]
RELATIVE_TOLERANCE = 1e-3
"""Max |logit difference| over the largest |logit| (the library's float32 logit check)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks_on_nxd(name: str, tp: int, expand_kv: bool = True, resident: bool = False, quant: str = "none") -> list[dict]:
    """Every rank's result of :func:`tests.nxd.nxd_worker.worker`, in rank order."""
    import torch.multiprocessing as mp

    from tests.nxd.nxd_worker import worker

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, tp, name, port, expand_kv, queue, resident, quant)) for r in range(tp)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(tp)]


def test_the_vendored_source_is_the_pinned_release():
    sums = (nxd_stubs.SOURCE / "SHA256SUMS").read_text().splitlines()
    assert len(sums) >= 40
    for line in sums:
        digest, rel = line.split(maxsplit=1)
        assert hashlib.sha256((nxd_stubs.SOURCE / rel).read_bytes()).hexdigest() == digest, rel


@pytest.mark.parametrize("name,tp", [("gemma-4-e4b", 2), ("gemma-4-e4b", 4), ("gemma-4-12b", 2), ("gemma-4-12b", 4),
                                     ("qwen2", 2)])
def test_nxd_parallel_layers_match_hugging_face(name, tp):
    results = run_ranks_on_nxd(name, tp)
    for rank, out in enumerate(results):
        assert "error" not in out, f"rank {rank}: {out.get('error')}\n{out.get('trace')}"
        assert out["parallel_layers"] > 0
        print(f"[nxd] {name} tp {tp} rank {rank}: max |logit diff| {out['max_abs_logit_diff']:.3g} "
              f"(largest |logit| {out['max_abs_logit']:.3g})", file=sys.stderr)
        assert out["max_abs_logit_diff"] <= RELATIVE_TOLERANCE * out["max_abs_logit"], out
    # every rank ends with the same all-reduced logits
    assert len({round(r["max_abs_logit_diff"], 9) for r in results}) == 1


def _phi3_config(directory: Path) -> str:
    """A small Phi-3 config.json whose 4 q / 2 kv heads split at tp 2 (the tiny variant's 6 / 3 straddle)."""
    import json

    from neuron_port.model.configs import config_to_dict, load_config

    raw = config_to_dict(load_config("phi-3", tiny=True))
    raw.update(num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    path = directory / "phi3-4q2kv.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("name,tp,quant", [("gemma-4-e4b", 2, "none"), ("gemma-4-12b", 4, "none"),
                                           ("gemma-4-12b", 2, "int8+head"), ("qwen2", 2, "none"), ("qwen2", 4, "none"),
                                           ("phi-3", 2, "none")])
def test_the_nxd_artifacts_traced_module_matches_hugging_face(name, tp, quant, tmp_path):
    """The modules an nxd artifact's ModelBuilder traces for a prefill key and a decode key (NxD's parallel
    layers, the KV store as parameters), given NxD's shard of the checkpoint keyed as that module names
    its weights: the last token's logits match Hugging Face's, the store is written, and a decode step
    from that store (new rows written by scatter) gives Hugging Face's next logits, on a decode key that reads a
    prefix of the store and then on the longer one; the core's shard is the planner's bytes. Also with NxD's
    quantized layers and the replicated int8 head (against the library's int8+head model), with Qwen2's
    biases (column-parallel: split with their rows; at tp 4 its 2 KV heads replicated, the K/V biases
    expanded with their rows) and Phi-3's fused projections cut into their roles."""
    if name == "phi-3":
        name = _phi3_config(tmp_path)
    results = run_ranks_on_nxd(name, tp, resident=True, quant=quant)
    for rank, out in enumerate(results):
        assert "error" not in out, f"rank {rank}: {out.get('error')}\n{out.get('trace')}"
        print(f"[nxd resident] {name} tp {tp} rank {rank}: max |logit diff| {out['max_abs_logit_diff']:.3g} "
              f"(largest |logit| {out['max_abs_logit']:.3g})", file=sys.stderr)
        assert out["max_abs_logit_diff"] <= RELATIVE_TOLERANCE * out["max_abs_logit"], out
        assert out["kv_written"] and out["kv_outputs"] > 0
        # decode keys of 16 and 32 positions, one after the other over the store the prefill wrote (the first
        # reading a prefix of it), writing their new rows by scatter
        assert out["decode_row_writes"]
        for diff, peak in zip(out["decode_max_abs_logit_diffs"], out["decode_max_abs_logits"], strict=True):
            assert diff <= RELATIVE_TOLERANCE * peak, out
        # what NxD's sharding put on this core against the planner's bytes per core (the scheme's)
        assert abs(out["shard_bytes"] / out["plan_weight_bytes"] - 1) < 0.02, out


@pytest.mark.parametrize("name,quant", [("gemma-4-e4b", "int8"), ("gemma-4-12b", "int8"), ("gemma-4-12b", "int8+head"),
                                        ("gemma-4-e2b", "int8")])
def test_nxd_quantized_layers_match_the_librarys_int8_model(name, quant):
    """NxD's own QuantizedColumnParallel / QuantizedRowParallel (per-channel symmetric int8, fp32 scales) at
    tp 2, loaded by NxD's sharding from the library's int8 checkpoint (int8 weights, [out, 1] scales, K/V
    rows and scales expanded by the plan): Hugging Face's forward of the library's int8 model, within the
    float32 bound; and measurably away from the float model (the layers really ran in int8)."""
    results = run_ranks_on_nxd(name, 2, quant=quant)
    for rank, out in enumerate(results):
        assert "error" not in out, f"rank {rank}: {out.get('error')}\n{out.get('trace')}"
        assert out["parallel_layers"] > 0 and out["weight_dtypes"] == ["torch.int8"]
        print(f"[nxd int8] {name} tp 2 rank {rank}: max |logit diff| {out['max_abs_logit_diff']:.3g} against the "
              f"library's int8 model, {out['float_max_abs_logit_diff']:.3g} against the float one (largest |logit| "
              f"{out['max_abs_logit']:.3g})", file=sys.stderr)
        assert out["max_abs_logit_diff"] <= RELATIVE_TOLERANCE * out["max_abs_logit"], out
        assert out["float_max_abs_logit_diff"] > 10 * out["max_abs_logit_diff"], out


def test_the_check_fails_without_the_plans_kv_expansion():
    """E4B's 2 KV heads over 4 ranks: NxD's even column split of the plain K/V rows cannot give
    each rank its replicated head (the expansion nxd_checkpoint does); the same check refuses it."""
    results = run_ranks_on_nxd("gemma-4-e4b", 4, expand_kv=False)
    assert any("error" in r or r["max_abs_logit_diff"] > RELATIVE_TOLERANCE * r["max_abs_logit"] for r in results)


def test_source_path_is_in_the_repository():
    assert (Path(nxd_stubs.SOURCE) / "neuronx_distributed" / "parallel_layers" / "layers.py").is_file()
