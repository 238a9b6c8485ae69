"""One gloo rank running the library's NxD pieces on neuronx-distributed's real code.

Spawned by :mod:`tests.test_nxd_source` (``tp`` processes). Each rank:

1. installs the import stand-ins (:mod:`tests.nxd_stubs`) and the vendored NxD source, sets
   ``NXD_CPU_MODE=1`` (NxD's collectives over torch.distributed gloo on the CPU) and calls NxD's
   ``parallel_state.initialize_model_parallel(tp)``;
2. builds the tiny model with other random weights (seed 1), swaps its projections for NxD's
   ColumnParallelLinear / RowParallelLinear with :func:`neuron_port.backends.nxd.parallelize_for_nxd`;
3. shards the seed-0 checkpoint with :func:`neuron_port.backends.nxd.nxd_checkpoint` (K/V rows
   expanded by the shard plan, buffers included) and NxD's own ``get_sharded_checkpoint``, and
   loads this rank's shard strictly (the tied head is the embedding's tensor);
4. runs the Hugging Face forward of the parallel model and compares every position's logits with
   Hugging Face's own seed-0 model (:func:`neuron_port.reference.reference_for_source`).
"""

from __future__ import annotations

import os
import traceback


def worker(rank: int, tp: int, name: str, port: int, expand_kv: bool, queue) -> None:
    os.environ["NXD_CPU_MODE"] = "1"
    try:
        queue.put((rank, _run(rank, tp, name, port, expand_kv)))
    except Exception as exc:  # reported to the parent, which asserts on it
        queue.put((rank, {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}))


def _run(rank: int, tp: int, name: str, port: int, expand_kv: bool) -> dict:
    import torch
    import torch.distributed as dist

    from tests import nxd_stubs

    nxd_stubs.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    try:
        from neuronx_distributed.parallel_layers import parallel_state
        from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear
        from neuronx_distributed.trace.trace import get_sharded_checkpoint

        from neuron_port.backends.nxd import nxd_checkpoint, parallelize_for_nxd
        from neuron_port.layout import describe
        from neuron_port.models import checkpoint_state, model_from_name
        from neuron_port.ranks import RankSetup
        from neuron_port.reference import reference_for_source

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        source = model_from_name(name, tiny=True, seed=0)
        setup = RankSetup.for_layout(describe(source), tp)
        checkpoint = nxd_checkpoint(source, setup) if expand_kv else checkpoint_state(source)
        model = parallelize_for_nxd(model_from_name(name, tiny=True, seed=1), setup)
        get_sharded_checkpoint(checkpoint, model, rank, tp)
        missing, unexpected = model.load_state_dict(checkpoint, strict=False)
        family = setup.layout.family
        tied = {family.lm_head_key()} if family.tied_embeddings(family.text_config_of(model)) else set()
        if set(missing) - tied or unexpected:  # strict, but for the tied head (the embedding's tensor)
            raise RuntimeError(f"rank {rank} shard: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
        parallel = sum(isinstance(m, (ColumnParallelLinear, RowParallelLinear)) for m in model.modules())
        ids = torch.tensor([[2] + list(range(10, 60))])
        reference = reference_for_source(name, tiny=True, seed=0).eval()
        with torch.no_grad():
            want = reference(ids).logits
            got = model.eval()(ids).logits
        diff = float((got - want).abs().max())
        return {"max_abs_logit_diff": diff, "max_abs_logit": float(want.abs().max()), "parallel_layers": parallel,
                "local_q_rows": int(next(m for m in model.modules() if isinstance(m, ColumnParallelLinear)).weight.shape[0])}
    finally:
        dist.destroy_process_group()
