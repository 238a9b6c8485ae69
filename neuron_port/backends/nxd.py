"""Tensor-parallel Neuron backend over neuronx-distributed's ModelBuilder.

What this module builds, all from the library's own shard plan (:mod:`neuron_port.parallel.sharding`):

* NxD's ColumnParallel / RowParallel layers sized by the plan (:func:`parallelize_for_nxd`; with a
  bias where the projection has one, NxD's quantized layers for an int8 model, one layer per role of
  a fused projection); the checkpoint its sharding splits is :mod:`neuron_port.backends.nxd_checkpoint`'s;
* the KV store as ``nn.Parameter``s of a wrapper module (:class:`KVResident`) and the
  ``input_output_aliases`` map that keeps them on the device (:func:`alias_map`);
* ModelBuilder model instances whose ``get`` returns the module they built with aliases keyed by
  its own KV parameters (:func:`graph_instance`), one ModelBuilder key per graph traced and sharded
  (:func:`build`), and a reload that initialises the executor with every rank's shard
  (:func:`load`: ``nxd_model.initialize(shards, start_rank)``); :class:`ResidentKVRunner` calls
  the executor the way the port calls runners;
* a guard: :func:`build` refuses to run inside one of the library's own rank workers
  (``NEURON_PORT_TP_CHILD``); release 2.28.0's ModelBuilder traces every rank in the calling
  process under a mocked process group.

Vendor imports happen only inside the functions that need them. :func:`parallelize_for_nxd` runs on
neuronx-distributed's real ``parallel_layers`` and ``get_sharded_checkpoint`` in
``tests/nxd/test_nxd_source.py`` (release 2.28.0, over gloo on the CPU); the ModelBuilder calls
follow that release's source and are checked by a recording stand-in
(``tests/backends/test_nxd_contract.py``) and end to end by the stand-in SDK
(``tests/support/sdk_standin``); they have not run on hardware.
:mod:`neuron_port.backends.nxd_artifact` writes and loads whole artifacts with them.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from neuron_port.backends.nxd_checkpoint import device_head
from neuron_port.backends.sdk import require_backend
from neuron_port.errors import NeuronPortError, ShardingError
from neuron_port.families import family_of
from neuron_port.graph.step import INPUT_NAMES
from neuron_port.model.quant import quant_of
from neuron_port.parallel.launch import CHILD_ENV, is_tp_child
from neuron_port.parallel.ranks import RankSetup


def device_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` as a device graph holds it, sharing the original's tensors: the host
    tables removed (their modules set to None), a float LM head a parameter of its own (the same memory
    as the tied word table, which the device no longer has; an int8 head keeps its buffers), and the projections that
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
    head = device_head(model).weight
    if isinstance(head, nn.Parameter):  # a float head (maybe the word table's): a parameter of its own
        memo[id(head)] = nn.Parameter(head.detach(), requires_grad=False)
    copy_ = copy.deepcopy(model, memo)  # the head is now its own tensor, once the tables go
    paths = {id(module): name for name, module in copy_.named_modules()}
    for table in (family.word_embedding(copy_), family.per_layer_embedding(copy_)):
        if table is not None:
            parent, _, leaf = paths[id(table)].rpartition(".")
            setattr(copy_.get_submodule(parent), leaf, None)
    return copy_


def check_nxd_supported(model: nn.Module, setup: RankSetup) -> None:
    """Refuse, before any tracing, a model the nxd layers cannot carry: a plan whose ranks straddle KV
    groups (each rank would need its own gather of K/V heads, which one SPMD graph cannot hold as
    constants). Biased projections are carried (NxD's parallel layers take ``bias=True``), fused ones
    are cut into their roles (:class:`~neuron_port.families.parts.RoleConcat`), and an int8 LM head stays the library's own
    replicated :class:`~neuron_port.model.quant.Int8Linear` (see :func:`parallelize_for_nxd`)."""
    family = setup.layout.family
    for spec in setup.layout.layers:
        if not setup.plan.layers[spec.index].plan.uniform:
            raise ShardingError(f"layer {spec.index}: {spec.n_q} q / {spec.n_kv} kv at tp {setup.tp} straddles KV groups "
                                f"({family.name}); the nxd backend supports shard and replicate plans only: pick a tp "
                                "that divides the KV heads or that they divide")


def parallelize_for_nxd(model: nn.Module, setup: RankSetup, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Replace projections with NxD's ColumnParallelLinear / RowParallelLinear sized by the plan (an int8
    model's with NxD's QuantizedColumnParallel / QuantizedRowParallel: :func:`_parallel_layers`).

    Runs inside an NxD rank worker (parallel state initialised). q, expanded k/v, gate and up are
    column-parallel without gathering; o and down are row-parallel with the all-reduce. A projection
    with a bias gets a layer with one (column-parallel: split with its rows; row-parallel: whole, added
    after the all-reduce, as NxD's layers do). Every role of a layer is installed at once through the
    family (:meth:`~neuron_port.families.decoder.DecoderFamily.set_attention_projections`), so a fused
    family builds its fused module from the roles' layers (Phi-3: a
    :class:`~neuron_port.families.parts.RoleConcat`). The LM head is left as it is: a replicated weight,
    or under ``--quant-head`` the library's replicated int8 head (see :func:`_parallel_layers`). Plans
    whose ranks straddle KV groups need per-rank gather matrices, which one SPMD graph cannot carry as
    constants: they are refused with the reason.
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
        attn, mlp = family.attention(layer), family.mlp(layer)
        proj, ff = family.layer_projections(layer, spec.index)
        biased = {role for role, m in {**proj, **ff}.items() if getattr(m, "bias", None) is not None}
        attention = {"q": column(h, spec.n_q * d, "q" in biased)}
        for role in ("k", "v"):
            if proj[role] is not None:
                attention[role] = column(h, tp * local_kv * d, role in biased)
        attention["o"] = row(spec.n_q * d, h, "o" in biased)
        family.set_attention_projections(attn, attention)
        family.set_kv_groups(attn, heads.ranks[0].groups)
        family.set_mlp_projections(mlp, {"gate": column(h, spec.intermediate_size, "gate" in biased),
                                         "up": column(h, spec.intermediate_size, "up" in biased),
                                         "down": row(spec.intermediate_size, h, "down" in biased)})
    return model


def _parallel_layers(quant: str, dtype: torch.dtype) -> tuple[Callable[[int, int, bool], nn.Module],
                                                                Callable[[int, int, bool], nn.Module]]:
    """(column, row): ``(in, out, bias) -> layer`` makers of NxD's parallel layers for ``quant``: ColumnParallelLinear
    (no gather) and RowParallelLinear (input already split, all-reduced output), or for ``"int8"`` and
    ``"int8+head"`` NxD's QuantizedColumnParallel / QuantizedRowParallel, per-channel symmetric int8 with fp32
    scales (the weight cast to the activation dtype, the output scaled in fp32, as
    :class:`~neuron_port.model.quant.Int8Linear`).

    The LM head is none of these. An int8 head stays the library's :class:`~neuron_port.model.quant.Int8Linear`,
    replicated on every core as the float head is: its int8 weight and its fp32 scale ``[vocab]`` are a plain
    module's buffers, which ModelBuilder loads as they are (``cast_weights`` casts parameters only). A
    column-parallel head (NxD's QuantizedColumnParallel with ``gather_output=True``; its scales would split
    with the vocab rows, since the per-channel axis is the partition axis, ``_setup_for_scale``) would read
    1/tp of the head per core at the cost of an all-gather of the logits every step; the planner counts the
    head replicated for every backend, so both heads move together or not at all."""
    if quant == "none":
        from neuronx_distributed.parallel_layers import ColumnParallelLinear, RowParallelLinear

        return (lambda i, o, bias: ColumnParallelLinear(i, o, bias=bias, gather_output=False, dtype=dtype),
                lambda i, o, bias: RowParallelLinear(i, o, bias=bias, input_is_parallel=True, dtype=dtype))
    from neuronx_distributed.quantization.quantization_config import QuantizationType, QuantizedDtype
    from neuronx_distributed.quantization.quantization_layers import QuantizedColumnParallel, QuantizedRowParallel

    scheme = {"dtype": dtype, "quantization_type": QuantizationType.PER_CHANNEL_SYMMETRIC,
              "quantized_dtype": QuantizedDtype.INT8, "quantization_per_channel_axis": 0, "scale_dtype": torch.float32}
    return (lambda i, o, bias: QuantizedColumnParallel(i, o, bias=bias, gather_output=False, **scheme),
            lambda i, o, bias: QuantizedRowParallel(i, o, bias=bias, input_is_parallel=True, **scheme))


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

    The executor's ``nxd_model`` takes the non-KV inputs only (a list; it routes them to a key by their
    shapes); the aliased KV store lives on the device and NxD's
    packer drops aliased outputs, so the executor returns the logits and the host store handed
    in is returned unchanged (it is a placeholder of the right shapes). A decode graph keyed by its
    KV length (``slot_ids``: that length) gets its ``slot_ids`` row appended, and a step whose rows
    hold more positions than it reads is refused: the graph would attend over a prefix that misses
    them, and write the new row nowhere."""

    def __init__(self, executor: Any, n_inputs: int, slot_ids: int | None = None):
        self.executor = executor
        self.n_inputs = n_inputs
        self.slot_ids = None if slot_ids is None else torch.arange(int(slot_ids), dtype=torch.long)

    def __call__(self, *args: torch.Tensor):
        inputs = list(args[: self.n_inputs])
        if self.slot_ids is not None:
            held = int(inputs[INPUT_NAMES.index("lengths")].max())  # positions each row holds once written
            if held > self.slot_ids.numel():
                raise NeuronPortError(f"a decode step of {held} positions on the graph that reads {self.slot_ids.numel()}: "
                                      "pick the smallest KV length that holds the context")
            inputs.append(self.slot_ids)
        # NxDModelExecutor.forward(*inputs) is ``nxd_model(list(inputs))`` traced at the first key's input count
        # (ModelBuilder.trace): keys of other arities (a decode key's slot_ids) are called on nxd_model itself
        out = self.executor.nxd_model(inputs)
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
    the full checkpoint keyed as the traced module names it
    (:func:`~neuron_port.backends.nxd_checkpoint.traced_checkpoint`); build the modules in the
    checkpoint's dtype (NxD casts the checkpoint to the module's dtype).
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
    "check_nxd_supported",
    "device_copy",
    "parallelize_for_nxd",
    "KVResident",
    "alias_map",
    "graph_instance",
    "ResidentKVRunner",
    "build",
    "load",
]
