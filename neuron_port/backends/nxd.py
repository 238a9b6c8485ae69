"""Tensor-parallel Neuron backend over neuronx-distributed's ModelBuilder.

What this module builds, all from the library's own shard plan (:mod:`neuron_port.parallel.sharding`):

* NxD's ColumnParallel / RowParallel layers sized by the plan (:func:`parallelize_for_nxd`) and
  the full checkpoint its sharding splits (:func:`nxd_checkpoint`): K/V rows expanded so an even
  column split hands every rank exactly the KV heads the plan gives it (replicated heads repeated),
  with buffers (Gemma-4's per-layer scalars) carried explicitly — NxD's own sharding loads parameters
  only, which silently over-scales every layer; :func:`rank_checkpoints` gives the per-rank view;
* the KV store as ``nn.Parameter``s of a wrapper module (:class:`KVResident`) and the
  ``input_output_aliases`` map that keeps them on the device (:func:`alias_map`);
* ModelBuilder model instances whose ``get`` returns the module they built with aliases keyed by
  its own KV parameters (:func:`graph_instance`), a checkpoint keyed as the traced wrapper names
  its weights (:func:`traced_checkpoint`), one ModelBuilder key per graph traced and sharded
  (:func:`build`), and a reload that initialises the executor with every rank's shard
  (:func:`load`: ``nxd_model.initialize(shards, start_rank)``); :class:`ResidentKVRunner` calls
  the executor the way the port calls runners;
* ``layer_dtype`` (e.g. bf16) casting of the rank checkpoints, which halves the neff (build the
  modules in that dtype too: NxD casts the checkpoint to the module's dtype);
* a guard: :func:`build` refuses to run inside one of the library's own rank workers
  (``NEURON_PORT_TP_CHILD``); release 2.28.0's ModelBuilder traces every rank in the calling
  process under a mocked process group.

Vendor imports happen only inside the functions that need them. :func:`parallelize_for_nxd` and
:func:`nxd_checkpoint` run on neuronx-distributed's real ``parallel_layers`` and
``get_sharded_checkpoint`` in ``tests/nxd/test_nxd_source.py`` (release 2.28.0, over gloo on the
CPU); the ModelBuilder calls follow that release's source and are checked by a recording stand-in
(``tests/backends/test_nxd_contract.py``); they have not run on hardware, and no artifact is written with
them. :mod:`neuron_port.backends.nxd_artifact` writes and loads whole artifacts with them.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from neuron_port.backends.sdk import require_backend
from neuron_port.errors import ShardingError
from neuron_port.families import family_of
from neuron_port.model.buffers import persistent_buffers
from neuron_port.model.loading import checkpoint_state
from neuron_port.model.quant import HEAD_SCHEMES, Int8Linear, fp32_keys, quant_of
from neuron_port.parallel.launch import CHILD_ENV, is_tp_child
from neuron_port.parallel.ranks import Rank, RankSetup, run_ranks
from neuron_port.parallel.sharding import expanded_kv_rows


def host_table_keys(model: nn.Module) -> list[str]:
    """Checkpoint keys of the tables the host gathers from (the word embedding, Gemma-4's per-layer
    embedding): the graphs take their rows as inputs, so no device shard holds them."""
    family = family_of(model)
    return [k for k in (family.word_embedding_key(), family.per_layer_embedding_key()) if k is not None]


def _lm_head(model: nn.Module) -> nn.Module:
    head = family_of(model).head_module(model)
    if getattr(head, "weight", None) is None:
        raise ShardingError(f"{type(model).__name__} has no head module with a weight; the nxd backend gives the "
                            "device its own head (untied from the host's word table) in that module")
    return head


def nxd_checkpoint(model: nn.Module, setup: RankSetup, layer_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full checkpoint NxD's sharding splits: device tensors only (no host table), the LM head
    under its own name even when the model ties it to the word table, K/V rows expanded by the
    setup's plan, buffers included, optionally cast to the layer dtype (bf16 halves the neff).
    An int8 model's projections follow NxD's quantized-layer convention: the int8 ``weight`` and an
    fp32 ``scale`` of shape [out, 1] (K/V scales expanded with their rows), never cast."""
    layout, plan = setup.layout, setup.plan
    family = layout.family
    state = checkpoint_state(model, clone=False)
    for name, buf in persistent_buffers(model).items():
        state[name] = buf.detach()  # NxD loads parameters only: carry the buffers explicitly
    state[family.lm_head_key()] = _lm_head(model).weight.detach()
    tables = tuple(key.rpartition(".")[0] + "." for key in host_table_keys(model))
    # the host tables (weights and any buffer of theirs) are left out before anything is copied
    state = {k: v.clone() for k, v in state.items() if not k.startswith(tables)}
    for spec, layer in zip(layout.layers, family.decoder_layers(model), strict=True):
        proj = family.attention_projections(family.attention(layer))
        for role in ("k", "v"):
            if proj[role] is not None:
                key = family.projection_key(spec.index, role)
                heads = plan.layers[spec.index].plan
                state[key] = expanded_kv_rows(proj[role].weight.detach(), heads, spec.head_dim)
                if isinstance(proj[role], Int8Linear):
                    scale_key = key.removesuffix("weight") + "scale"
                    state[scale_key] = expanded_kv_rows(proj[role].scale.detach()[:, None], heads, spec.head_dim)[:, 0]
    scales = fp32_keys(model)
    for key in scales:  # NxD's per-channel scale is [out, 1] (its scale_dequantize broadcasts it over the output)
        state[key] = state[key].reshape(-1, 1).float()
    if layer_dtype is not None:
        state = {k: (v.to(layer_dtype) if v.is_floating_point() and k not in scales else v) for k, v in state.items()}
    return state


def device_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` as a device graph holds it, sharing the original's tensors: the host
    tables removed (their modules set to None), the LM head a parameter of its own (the same memory
    as the tied word table, which the device no longer has), and the projections that
    :func:`parallelize_for_nxd` replaces left on the meta device (they are never copied). Every
    other parameter and buffer is the original's memory, so tracing many graphs keeps one host
    copy of the weights."""
    family = family_of(model)
    memo: dict[int, object] = {}
    for tensor in model.buffers():
        memo[id(tensor)] = tensor
    for param in model.parameters():
        memo[id(param)] = nn.Parameter(param.detach(), requires_grad=False)
    replaced = [family.word_embedding(model), family.per_layer_embedding(model)]
    for index, layer in enumerate(family.decoder_layers(model)):
        attn, mlp = family.layer_projections(layer, index)
        replaced += [m for m in (*attn.values(), *mlp.values()) if m is not None]
    for module in replaced:
        if isinstance(module, nn.Module):
            for param in module.parameters(recurse=False):
                memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=False)
    head = _lm_head(model).weight
    memo[id(head)] = nn.Parameter(head.detach(), requires_grad=False)
    copy_ = copy.deepcopy(model, memo)  # the head is now its own parameter, once the tables go
    paths = {id(module): name for name, module in copy_.named_modules()}
    for table in (family.word_embedding(copy_), family.per_layer_embedding(copy_)):
        if table is not None:
            parent, _, leaf = paths[id(table)].rpartition(".")
            setattr(copy_.get_submodule(parent), leaf, None)
    return copy_


def check_nxd_supported(model: nn.Module, setup: RankSetup) -> None:
    """Refuse, before any tracing, a model the nxd layers cannot carry: fused projections, projections
    with a bias (the parallel layers are built without one, so a bias would be dropped and the logits
    wrong), a plan whose ranks straddle KV groups, or an int8 LM head (``--quant-head``)."""
    family = setup.layout.family
    if quant_of(model) in HEAD_SCHEMES:
        raise ShardingError("--quant-head on nxd: not built (NxD's head here is a plain replicated weight; an int8 head "
                            "needs its own quantized layer and checkpoint scale). Use --quant int8 alone on nxd, or the "
                            "cpu and xla backends for an int8 head")
    if family.fused_projections:
        raise ShardingError(f"the {family.name} adapter fuses its projections; the nxd backend swaps one "
                            "parallel layer per role and supports unfused families only")
    for spec, layer in zip(setup.layout.layers, family.decoder_layers(model), strict=True):
        attn, mlp = family.layer_projections(layer, spec.index)
        biased = [role for role, module in {**attn, **mlp}.items() if getattr(module, "bias", None) is not None]
        if biased:
            raise ShardingError(f"layer {spec.index}'s {', '.join(biased)} projections have a bias ({family.name}); the "
                                "nxd backend's parallel layers carry none, and dropping it would change the logits: "
                                "not supported on nxd or neuron yet (use the cpu or xla backends)")
        if not setup.plan.layers[spec.index].plan.uniform:
            raise ShardingError(f"layer {spec.index}: {spec.n_q} q / {spec.n_kv} kv at tp {setup.tp} straddles KV groups; "
                                "the nxd backend supports shard and replicate plans only")


def parallelize_for_nxd(model: nn.Module, setup: RankSetup, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Replace projections with NxD's ColumnParallelLinear / RowParallelLinear sized by the plan (an int8
    model's with NxD's QuantizedColumnParallel / QuantizedRowParallel: :func:`_parallel_layers`).

    Runs inside an NxD rank worker (parallel state initialised). q, expanded k/v, gate and up are
    column-parallel without gathering; o and down are row-parallel with the all-reduce. Plans
    whose ranks straddle KV groups need per-rank gather matrices, which one SPMD graph cannot
    carry as constants: they are refused with the reason.
    """
    require_backend("nxd")
    check_nxd_supported(model, setup)
    column, row = _parallel_layers(quant_of(model), dtype)
    layout, plan, tp = setup.layout, setup.plan, setup.tp
    family = layout.family
    h = layout.hidden_size
    for spec, layer in zip(layout.layers, family.decoder_layers(model), strict=True):
        heads = plan.layers[spec.index].plan
        d, local_kv = spec.head_dim, len(heads.ranks[0].kv_heads)
        attn = family.attention(layer)
        proj = family.attention_projections(attn)
        family.set_attention_projection(attn, "q", column(h, spec.n_q * d))
        for role in ("k", "v"):
            if proj[role] is not None:
                family.set_attention_projection(attn, role, column(h, tp * local_kv * d))
        family.set_attention_projection(attn, "o", row(spec.n_q * d, h))
        family.set_kv_groups(attn, heads.ranks[0].groups)
        mlp = family.mlp(layer)
        for role in ("gate", "up"):
            family.set_mlp_projection(mlp, role, column(h, spec.intermediate_size))
        family.set_mlp_projection(mlp, "down", row(spec.intermediate_size, h))
    return model


def _parallel_layers(quant: str, dtype: torch.dtype) -> tuple[Callable[[int, int], nn.Module], Callable[[int, int], nn.Module]]:
    """(column, row): ``(in, out) -> layer`` makers of NxD's parallel layers for ``quant``: ColumnParallelLinear
    (no gather) and RowParallelLinear (input already split, all-reduced output), or for ``"int8"`` NxD's
    QuantizedColumnParallel / QuantizedRowParallel, per-channel symmetric int8 with fp32 scales (the weight
    cast to the activation dtype, the output scaled in fp32, as :class:`~neuron_port.model.quant.Int8Linear`)."""
    if quant == "none":
        from neuronx_distributed.parallel_layers import ColumnParallelLinear, RowParallelLinear

        return (functools.partial(ColumnParallelLinear, bias=False, gather_output=False, dtype=dtype),
                functools.partial(RowParallelLinear, bias=False, input_is_parallel=True, dtype=dtype))
    from neuronx_distributed.quantization.quantization_config import QuantizationType, QuantizedDtype
    from neuronx_distributed.quantization.quantization_layers import QuantizedColumnParallel, QuantizedRowParallel

    scheme = {"bias": False, "dtype": dtype, "quantization_type": QuantizationType.PER_CHANNEL_SYMMETRIC,
              "quantized_dtype": QuantizedDtype.INT8, "quantization_per_channel_axis": 0, "scale_dtype": torch.float32}
    return (functools.partial(QuantizedColumnParallel, gather_output=False, **scheme),
            functools.partial(QuantizedRowParallel, input_is_parallel=True, **scheme))


def _rank_state(layer_dtype: torch.dtype | None, rank: Rank) -> dict[str, torch.Tensor]:
    state = checkpoint_state(rank.model, clone=False)
    for name, buf in persistent_buffers(rank.model).items():
        state[name] = buf.detach().clone()
    if layer_dtype is not None:
        state = {k: (v.to(layer_dtype) if v.is_floating_point() else v) for k, v in state.items()}
    return state


def rank_checkpoints(model: nn.Module, setup: RankSetup, layer_dtype: torch.dtype | None = None) -> list[dict[str, torch.Tensor]]:
    """Per-rank state dicts from the setup's shard plan, buffers included, optionally cast (each
    rank's shard made by :func:`neuron_port.parallel.ranks.run_ranks`, as threads)."""
    return run_ranks(functools.partial(_rank_state, layer_dtype), setup, model, mode="threads")


def save_rank_checkpoints(checkpoints: Sequence[dict[str, torch.Tensor]], out_dir: Path) -> list[Path]:
    """``tp{r}_sharded_checkpoint.safetensors`` per rank (NxD's own naming)."""
    paths = []
    for rank, state in enumerate(checkpoints):
        path = Path(out_dir) / f"tp{rank}_sharded_checkpoint.safetensors"
        save_file(state, str(path))
        paths.append(path)
    return paths


class KVResident(nn.Module):
    """A graph whose KV tensors are parameters, so NxD can alias them to outputs on device.

    forward(*non_kv_inputs) -> (logits, *new_kv); the i-th KV parameter aliases output 1 + i.
    """

    def __init__(self, graph: nn.Module, kv_shapes: Sequence[Sequence[int]], dtype: torch.dtype):
        super().__init__()
        self.graph = graph
        self.kv = nn.ParameterList([nn.Parameter(torch.zeros(*s, dtype=dtype), requires_grad=False) for s in kv_shapes])

    def forward(self, *inputs: torch.Tensor):
        return self.graph(*inputs, *self.kv)


def alias_map(resident: KVResident) -> dict[nn.Parameter, int]:
    """{kv parameter: output index} — the ``input_output_aliases`` NxD expects: keys are tensors
    of the very module that is traced (NxD matches them against that module's state)."""
    return {p: 1 + i for i, p in enumerate(resident.kv)}


TRACED_PREFIX = "graph.model."
"""Where a :class:`KVResident` wrapper names the model's weights: ``graph`` (the static graph)
then ``model`` (the CausalLM it runs)."""


def traced_checkpoint(model: nn.Module, setup: RankSetup, layer_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """:func:`nxd_checkpoint` keyed as the traced wrapper names its weights (``graph.model.<key>``):
    ModelBuilder shards a checkpoint by the traced module's parameter names and silently keeps
    none of a checkpoint keyed by the checkpoint's own names. The traced module (built on
    :func:`device_copy`) has no host table and its own head, so every name here is one of its
    tensors and no tensor goes by two names."""
    return {TRACED_PREFIX + k: v for k, v in nxd_checkpoint(model, setup, layer_dtype).items()}


def graph_instance(make_resident: Callable[[], KVResident]) -> Any:
    """ModelBuilder's model instance for one graph key.

    ``load_module`` builds the KV-resident wrapper (called by ModelBuilder under its parallel
    state, so ``make_resident`` may build NxD parallel layers); ``get`` returns that module with
    the aliases of *its own* KV parameters (NxD's BaseModelInstance would rebuild the module and
    leave the aliases pointing at another instance's tensors)."""
    require_backend("nxd")
    from neuronx_distributed.trace.model_builder import BaseModelInstance

    class _ResidentInstance(BaseModelInstance):
        def __init__(self):
            super().__init__(make_resident, {})

        def load_module(self):
            self.module = make_resident()

        def get(self, bucket_rank, **kwargs):
            return self.module, alias_map(self.module)

    return _ResidentInstance()


class ResidentKVRunner:
    """A step of an NxD executor as the port calls runners: ``runner(*inputs, *kv)``.

    The executor takes the non-KV inputs only; the aliased KV store lives on the device and NxD's
    packer drops aliased outputs, so the executor returns the logits and the host store handed
    in is returned unchanged (it is a placeholder of the right shapes)."""

    def __init__(self, executor: Any, n_inputs: int):
        self.executor = executor
        self.n_inputs = n_inputs

    def __call__(self, *args: torch.Tensor):
        out = self.executor(*args[: self.n_inputs])
        logits = out[0] if isinstance(out, (list, tuple)) else out
        return (logits, *args[self.n_inputs :])


def build(
    graphs: dict[str, tuple[Callable[[], KVResident], Sequence[torch.Tensor]]],
    checkpoint_loader: Callable[[], dict[str, torch.Tensor]],
    tp: int,
    out_dir: Path,
    compiler_args: str = "--model-type=transformer --auto-cast=none",
    compiler_workdir: str | Path | None = None,
) -> Path:
    """Trace every graph key with one ModelBuilder and save the executor and the per-rank shards.

    ``graphs``: {key: (make_resident, non-KV example inputs)}; every key's KV parameters must have
    the same names and shapes (NxD keeps one state for all keys). ``checkpoint_loader`` returns
    the full checkpoint keyed as the traced module names it (:func:`traced_checkpoint`); build
    the modules in the checkpoint's dtype (NxD casts the checkpoint to the module's dtype).
    Writes ``model.pt`` and ``weights/tp{r}_sharded_checkpoint.safetensors``; the compiler works
    in ``compiler_workdir`` (default ``out_dir/compiler``). NxD's executor picks a graph by the
    shapes of its inputs, so two keys with the same input shapes are refused."""
    if is_tp_child():
        raise RuntimeError(f"nxd build called inside a rank worker ({CHILD_ENV}=1): refusing to re-spawn")
    require_backend("nxd")
    from neuronx_distributed.trace.model_builder import ModelBuilder

    routes: dict[str, str] = {}
    for key, (_, inputs) in graphs.items():
        shapes = str([tuple(t.shape) for t in inputs])
        if shapes in routes:
            raise ValueError(
                f"graphs {routes[shapes]!r} and {key!r} take inputs of the same shapes {shapes}: "
                "NxD's executor routes a call by its input shapes and could not tell them apart"
            )
        routes[shapes] = key

    os.environ[CHILD_ENV] = "1"  # inherited by any worker ModelBuilder starts
    try:
        builder = ModelBuilder(
            router=None,
            tp_degree=tp,
            checkpoint_loader=checkpoint_loader,
            compiler_workdir=str(compiler_workdir or Path(out_dir) / "compiler"),
        )
        for key, (make_resident, inputs) in graphs.items():
            builder.add(key, graph_instance(make_resident), [tuple(inputs)], compiler_args)
        executor = builder.trace(initialize_model_weights=False)
        path = Path(out_dir) / "model.pt"
        torch.jit.save(executor, str(path))
        builder.shard_checkpoint(serialize_path=str(Path(out_dir) / "weights"))
        return path
    finally:
        os.environ.pop(CHILD_ENV, None)


def load(artifact_dir: Path, tp: int, start_rank: int = 0) -> Any:
    """``torch.jit.load`` the executor, then ``nxd_model.initialize`` with the shards of ranks
    ``start_rank .. start_rank + tp - 1`` (this host's)
    (``initialize_with_saved_weights`` after a trace without weights would run placeholders)."""
    require_backend("nxd")
    import torch_neuronx  # noqa: F401  (registers the Neuron runtime ops)
    from safetensors.torch import load_file

    model = torch.jit.load(str(Path(artifact_dir) / "model.pt"))
    shards = [
        load_file(str(Path(artifact_dir) / "weights" / f"tp{r}_sharded_checkpoint.safetensors"))
        for r in range(start_rank, start_rank + tp)
    ]
    model.nxd_model.initialize(shards, torch.tensor([start_rank], dtype=torch.int32))
    return model


__all__ = [
    "host_table_keys",
    "check_nxd_supported",
    "device_copy",
    "nxd_checkpoint",
    "traced_checkpoint",
    "parallelize_for_nxd",
    "rank_checkpoints",
    "save_rank_checkpoints",
    "KVResident",
    "alias_map",
    "graph_instance",
    "ResidentKVRunner",
    "build",
    "load",
    "TRACED_PREFIX",
]
