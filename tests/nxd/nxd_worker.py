"""One gloo rank running the library's NxD pieces on neuronx-distributed's real code.

Spawned by :mod:`tests.nxd.test_nxd_source` (``tp`` processes). Each rank:

1. installs the import stand-ins (:mod:`tests.nxd.nxd_stubs`) and the vendored NxD source, sets
   ``NXD_CPU_MODE=1`` (NxD's collectives over torch.distributed gloo on the CPU) and calls NxD's
   ``parallel_state.initialize_model_parallel(tp)``;
2. builds the tiny model with other random weights (seed 1), swaps its projections for NxD's
   ColumnParallelLinear / RowParallelLinear with :func:`neuron_port.backends.nxd.parallelize_for_nxd`;
3. shards the seed-0 checkpoint with :func:`neuron_port.backends.nxd_checkpoint.nxd_checkpoint` (K/V rows
   expanded by the shard plan, buffers included, no host tables) and NxD's own
   ``get_sharded_checkpoint``, and loads this rank's shard strictly, with the host's tables beside
   it (this check runs the whole Hugging Face forward, embeddings included);
4. runs the Hugging Face forward of the parallel model and compares every position's logits with
   Hugging Face's own seed-0 model (:func:`neuron_port.checks.reference.reference_for_source`).

With ``resident``, steps 2-4 run on what an nxd artifact's ModelBuilder traces instead: the
KV-resident prefill module :func:`neuron_port.backends.nxd_artifact.resident_factory` builds,
sharded from :func:`neuron_port.backends.nxd_checkpoint.traced_checkpoint` (``_run_resident``).
"""

from __future__ import annotations

import os
import traceback


def worker(rank: int, tp: int, name: str, port: int, expand_kv: bool, queue, resident: bool = False,
           quant: str = "none") -> None:
    os.environ["NXD_CPU_MODE"] = "1"
    try:
        queue.put((rank, _run(rank, tp, name, port, expand_kv, resident, quant)))
    except Exception as exc:  # reported to the parent, which asserts on it
        queue.put((rank, {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}))


def _run(rank: int, tp: int, name: str, port: int, expand_kv: bool, resident: bool, quant: str = "none") -> dict:
    import torch
    import torch.distributed as dist

    from tests.nxd import nxd_stubs

    nxd_stubs.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    try:
        from neuronx_distributed.parallel_layers import parallel_state
        from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear
        from neuronx_distributed.quantization.quantization_layers import BaseQuantizeParallelLinear
        from neuronx_distributed.trace.trace import get_sharded_checkpoint

        from neuron_port.backends.nxd import parallelize_for_nxd
        from neuron_port.backends.nxd_checkpoint import host_table_keys, nxd_checkpoint
        from neuron_port.checks.reference import reference_for_source
        from neuron_port.model.layout import describe
        from neuron_port.model.loading import checkpoint_state, model_from_name
        from neuron_port.parallel.ranks import RankSetup

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        tiny = not name.endswith(".json")  # a config.json file: a small model of its own, taken as it is
        source = model_from_name(name, tiny=tiny, seed=0, quant=quant)
        setup = RankSetup.for_layout(describe(source), tp)
        if resident:
            return _run_resident(rank, tp, name, source, setup, get_sharded_checkpoint, quant)
        checkpoint = nxd_checkpoint(source, setup) if expand_kv else checkpoint_state(source)
        # ModelBuilder builds its layers in NxD's AOT mode, which skips their random initialisation (on
        # the CPU that path cannot initialise a quantized row-parallel weight at tp > 1); as it does:
        parallel_state.set_aot_mode(True)
        try:
            model = parallelize_for_nxd(model_from_name(name, tiny=tiny, seed=1, quant=quant), setup)
        finally:
            parallel_state.set_aot_mode(False)
        get_sharded_checkpoint(checkpoint, model, rank, tp)
        # this check runs Hugging Face's whole forward, embeddings included: the host's tables (which
        # no device shard holds) are loaded beside the shard
        tables = set(host_table_keys(source))
        host = {k: v for k, v in checkpoint_state(source).items() if k in tables}
        missing, unexpected = model.load_state_dict({**checkpoint, **host}, strict=False)
        family = setup.layout.family
        tied = {family.lm_head_key()} if family.tied_embeddings(family.text_config_of(model)) else set()
        named = model.state_dict(keep_vars=True)
        held = {id(named[n]) for n in checkpoint if n in named}
        tied |= {n for n, t in named.items() if id(t) in held}  # AOT mode's master_weight is the weight itself
        if set(missing) - tied or unexpected:  # strict, but for the tied head (the embedding's tensor)
            raise RuntimeError(f"rank {rank} shard: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
        kinds = (BaseQuantizeParallelLinear,) if quant != "none" else (ColumnParallelLinear, RowParallelLinear)
        layers = [m for m in model.modules() if isinstance(m, kinds)]
        ids = torch.tensor([[2] + list(range(10, 60))])
        # the oracle: Hugging Face's forward of the same seed-0 model, quantized as the library quantizes it
        reference = reference_for_source(name, tiny=tiny, seed=0, quant=quant).eval()
        with torch.no_grad():
            want = reference(ids).logits
            got = model.eval()(ids).logits
        diff = float((got - want).abs().max())
        out = {"max_abs_logit_diff": diff, "max_abs_logit": float(want.abs().max()), "parallel_layers": len(layers),
               "local_q_rows": int(layers[0].weight.shape[0]), "weight_dtypes": sorted({str(m.weight.dtype) for m in layers})}
        if quant != "none":  # and how far both are from the float model (what the quantization costs)
            with torch.no_grad():
                out["float_max_abs_logit_diff"] = float((got - reference_for_source(name, tiny=tiny, seed=0)(ids).logits)
                                                        .abs().max())
        return out
    finally:
        dist.destroy_process_group()


def _run_resident(rank: int, tp: int, name: str, source, setup, get_sharded_checkpoint, quant: str = "none") -> dict:
    """What an nxd artifact's ModelBuilder traces for a prefill key and then a decode key (the modules its
    ``load_module`` builds, with NxD's parallel layers and the rank-local KV store as parameters), given
    this rank's shard of the checkpoint keyed as the traced module names it, by NxD's own sharding; the
    decode module starts from the store the prefill wrote, and writes its new rows by scatter."""
    import torch

    from neuron_port.backends.nxd_artifact import resident_factory, slot_ids
    from neuron_port.backends.nxd_checkpoint import traced_checkpoint
    from neuron_port.checks.reference import reference_for_source
    from neuron_port.generation.logits import softcap
    from neuron_port.graph.embedding import HostEmbeddings
    from neuron_port.graph.host_inputs import HostInputs
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.loading import model_from_name
    from neuron_port.parallel.per_core import core_params

    tiny = not name.endswith(".json")
    local = PortShape(16, [16, 32]).stores(setup.layout, setup.plan.local_kv_heads(rank))
    inputs = HostInputs(setup.layout, local, HostEmbeddings.from_model(source))
    kv = inputs.new_store(1, 32).tensors()  # the one store every key aliases, at the largest length
    shard_bytes = []

    def loaded(kind: str, size: int):
        from neuronx_distributed.parallel_layers import parallel_state

        parallel_state.set_aot_mode(True)  # as ModelBuilder builds them (see _run)
        try:
            module = resident_factory(model_from_name(name, tiny=tiny, seed=1, quant=quant), setup, local, kind, size,
                                      [t.shape for t in kv], kv[0].dtype)()
        finally:
            parallel_state.set_aot_mode(False)
        checkpoint = traced_checkpoint(source, setup)
        get_sharded_checkpoint(checkpoint, module, rank, tp)
        shard_bytes.append(sum(t.numel() * t.element_size() for t in checkpoint.values()))  # this core's shard
        missing, unexpected = module.load_state_dict(checkpoint, strict=False)
        named = module.state_dict(keep_vars=True)
        held = {id(named[n]) for n in checkpoint if n in named}
        tied = {n for n, t in named.items() if id(t) in held}  # a tied head loads under the name the checkpoint gives
        if [m for m in missing if not m.startswith("kv.") and m not in tied] or unexpected:
            raise RuntimeError(f"rank {rank} shard: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
        return module.eval()

    module = loaded("prefill", 16)
    ids = torch.tensor([[2] + list(range(10, 20))])
    padded = torch.nn.functional.pad(ids, (0, 16 - ids.shape[1]))  # right-padded to the bucket
    step = inputs.prefill(padded, torch.tensor([ids.shape[1]]), 16)
    family = setup.layout.family
    cap = family.softcap(family.text_config_of(source))
    reference = reference_for_source(name, tiny=tiny, seed=0, quant=quant).eval()
    with torch.no_grad():
        out = module(*step)
        got = softcap(out[0][0], cap)
        want = reference(ids).logits[0, -1]
        # then a decode step on the 16-position key (a prefix of the store the prefill wrote), and one on the
        # 32-position key from the store that step left: new rows by scatter, one store for both
        short, long = loaded("decode", 16), loaded("decode", 32)
        state = out[1:]
        seen, diffs, peaks = ids, [], []
        for key, size in ((short, 16), (long, 32)):
            for param, written_kv in zip(key.kv, state, strict=True):
                param.copy_(written_kv)
            token = int(reference(seen).logits[0, -1].argmax())
            decoded = key(*inputs.decode_fresh(torch.tensor([token]), torch.tensor([seen.shape[1]])),
                          slot_ids(size))
            state = decoded[1:]
            seen = torch.cat([seen, torch.tensor([[token]])], dim=1)
            want_next = reference(seen).logits[0, -1]
            diffs.append(float((softcap(decoded[0][0], cap) - want_next).abs().max()))
            peaks.append(float(want_next.abs().max()))
    written = sum(float(t.abs().sum()) for t in out[1:])
    planned = core_params(setup.layout, source.config, tp).weight_bytes(4, quant)
    return {"max_abs_logit_diff": float((got - want).abs().max()), "max_abs_logit": float(want.abs().max()),
            "kv_written": written > 0, "kv_outputs": len(out) - 1,
            "decode_row_writes": short.graph.kv_write == long.graph.kv_write == "rows",
            "decode_max_abs_logit_diffs": diffs, "decode_max_abs_logits": peaks,
            "shard_bytes": shard_bytes[0], "plan_weight_bytes": planned}
