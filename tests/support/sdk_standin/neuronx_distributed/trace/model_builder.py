"""Stand-in of neuronx-distributed 2.28.0's ModelBuilder (see tests/support/sdk_standin/README.md).

Each key's module is built and traced once, as rank 0 of ``tp`` (one SPMD graph for every core, as
``trace/spmd.py`` does), by TorchScript as a function of (inputs, weights, state, rank), so the saved
executor holds no weights and runs exactly the ones ``initialize`` hands each rank. At run time the
executor runs every rank's graph at once (a forked task per rank beyond the first), each with its own
shard and its own KV state, meeting at the graph's all-reduces (:mod:`neuronx_distributed.parallel_layers.mappings`),
and returns rank 0's outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn


def _parallel_state():
    """The stand-in's parallel state, imported when a trace needs it (this module is also read on its own by a
    contract test that names only ``BaseModelInstance``)."""
    from neuronx_distributed.parallel_layers import parallel_state

    return parallel_state


class BaseModelInstance:
    def __init__(self, module_cls, input_output_aliases):
        self.module_cls = module_cls
        self.module = None
        self.input_output_aliases = [input_output_aliases]

    def load_module(self):
        self.module = self.module_cls()

    def get(self, bucket_rank, **kwargs):
        return self.module, self.input_output_aliases[0]


@torch.jit.script
def shape_key(inputs: list[torch.Tensor]) -> str:
    key = ""
    for t in inputs:
        for d in t.size():
            key += str(d) + ","
        key += ";"
    return key


class _Functional(nn.Module):
    """``module`` as a function of its inputs, its weights and its state (all lists): its
    parameters and persistent buffers become plain attributes set from the lists on every call.
    ``groups[i]``: the names the i-th tensor goes by (a tied tensor has several)."""

    def __init__(self, module: nn.Module, groups: list[list[str]]):
        super().__init__()
        self.inner = [module]  # not a submodule: its tensors must not become the trace's constants
        self.groups = groups
        for names in groups:
            for name in names:
                owner, leaf = self._owner(name)
                owner._parameters.pop(leaf, None)
                owner._buffers.pop(leaf, None)

    def _owner(self, name: str):
        *path, leaf = name.split(".")
        owner = self.inner[0]
        for part in path:
            owner = getattr(owner, part)
        return owner, leaf

    def forward(self, xs: list[torch.Tensor], ws: list[torch.Tensor], st: list[torch.Tensor], rank: torch.Tensor):
        for names, tensor in zip(self.groups, [*ws, *st], strict=True):
            for name in names:
                owner, leaf = self._owner(name)
                object.__setattr__(owner, leaf, tensor)
        state = _parallel_state()
        state._RANK_TENSOR = rank  # the collectives read the rank from the graph's input
        try:
            return list(self.inner[0](*xs))
        finally:
            state._RANK_TENSOR = None


def _weight_groups(named: dict, skip: list[str]) -> list[list[str]]:
    """The module's tensors by identity, each as its sorted names (the first is the one a
    checkpoint gives, as NxD's duplicate removal keeps it)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in named.items():
        if name not in skip:
            groups.setdefault(id(tensor), []).append(name)
    return [sorted(names) for names in groups.values()]


def _lossy_cast(given: torch.dtype, traced: torch.dtype) -> bool:
    """Whether casting a checkpoint tensor of ``given`` dtype to a parameter of ``traced`` dtype is refused: an
    integer parameter takes its own dtype only; a float one no narrower float (its precision is gone)."""
    if given == traced:
        return False
    if not traced.is_floating_point or not given.is_floating_point:
        return True
    return torch.finfo(given).bits < torch.finfo(traced).bits


class StandInNxDModel(nn.Module):
    def __init__(self, models: dict[str, nn.Module], routes: dict[str, str], tp: int, weight_names: list[str],
                 weight_dtypes: list[torch.Tensor], weight_shapes: list[list[int]], state_template: list[torch.Tensor],
                 private_state: bool):
        super().__init__()
        self.models = nn.ModuleDict(models)
        self.routes = routes
        self.tp = tp
        self.weight_names = weight_names
        self.state_template = state_template
        self.private_state = private_state
        self.weight_dtypes: list[torch.Tensor] = weight_dtypes  # empty tensors of the traced dtypes
        self.weight_shapes: list[list[int]] = weight_shapes  # each rank's (local) shapes: one graph for every core
        self.weights: list[list[torch.Tensor]] = [[torch.zeros(0)]]
        self.device_tensors: list[dict[str, torch.Tensor]] = [{"": torch.zeros(0)}]
        self.state: dict[str, list[torch.Tensor]] = {"": [torch.zeros(0)]}

    @torch.jit.export
    def initialize(self, checkpoint: list[dict[str, torch.Tensor]], start_rank_tensor: torch.Tensor):
        if len(checkpoint) != self.tp or int(start_rank_tensor[0]) != 0:
            raise RuntimeError("the stand-in runs every rank on one host: expected one checkpoint per rank "
                               "and start rank 0")
        # as _parallel_load: every tensor of a rank's shard goes to its core, named by the module or not
        self.device_tensors = checkpoint
        ranks: list[list[torch.Tensor]] = []
        for r in range(self.tp):
            weights: list[torch.Tensor] = []
            for i in range(len(self.weight_names)):
                name = self.weight_names[i]
                if name not in checkpoint[r]:
                    raise RuntimeError("rank " + str(r) + "'s shard lacks the traced weight " + name)
                tensor = checkpoint[r][name]
                if tensor.dtype != self.weight_dtypes[i].dtype:
                    raise RuntimeError("rank " + str(r) + "'s " + name + " is not in the dtype the graph was traced with")
                if list(tensor.shape) != self.weight_shapes[i]:
                    raise RuntimeError("rank " + str(r) + "'s " + name + " is not in the shape the graph was traced with")
                weights.append(tensor)
            ranks.append(weights)
        self.weights = ranks
        state: dict[str, list[torch.Tensor]] = {}
        for slot in [""] + list(self.routes.values()):
            for r in range(self.tp):
                state[slot + "/" + str(r)] = [t.clone() for t in self.state_template]
        self.state = state

    def run_rank(self, key: str, inputs: list[torch.Tensor], rank: int, slot: str) -> list[torch.Tensor]:
        out: list[torch.Tensor] = [torch.zeros(0)]
        for name, model in self.models.items():
            if name == key:
                out = model(inputs, self.weights[rank], self.state[slot + "/" + str(rank)],
                            torch.tensor([rank], dtype=torch.long))
        return out

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        key = self.routes[shape_key(inputs)]
        slot = key if self.private_state else ""
        # every core runs the same graph at once, meeting at its all-reduces
        others = [torch.jit.fork(self.run_rank, key, inputs, r, slot) for r in range(1, self.tp)]
        outs = [self.run_rank(key, inputs, 0, slot)]
        for future in others:
            outs.append(torch.jit.wait(future))
        for r in range(self.tp):
            self.state[slot + "/" + str(r)] = outs[r][1:]
        return outs[0][:1]


class NxDModelExecutor(nn.Module):
    def __init__(self, nxd_model):
        super().__init__()
        self.nxd_model = nxd_model

    def forward(self, *inputs):
        return self.nxd_model(list(inputs))


def _partitions(module: nn.Module) -> dict[str, tuple[int, int]]:
    """{parameter name: (partition dim, partitions)} of every split parameter, as NxD's layers mark them."""
    return {name: (p.partition_dim, p.num_partitions) for name, p in module.named_parameters(remove_duplicate=False)
            if getattr(p, "tensor_model_parallel", False)}


def _rank_slice(tensor: torch.Tensor, dim: int, partitions: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous part of ``tensor`` along ``dim`` (``create_local_weight`` with stride 1)."""
    if tensor.shape[dim] % partitions:
        raise RuntimeError(f"a checkpoint tensor of shape {tuple(tensor.shape)} does not split in {partitions} along {dim}")
    return torch.split(tensor, tensor.shape[dim] // partitions, dim=dim)[rank]


class ModelBuilder:
    def __init__(self, router, tp_degree, checkpoint_loader, compiler_workdir=None, **kwargs):
        if int(tp_degree) < 1:
            raise ValueError(f"tp_degree must be at least 1, found {tp_degree}")
        self.tp, self.loader, self.keys = int(tp_degree), checkpoint_loader, {}

    def add(self, key, model_instance, example_inputs, compiler_args=None, **kwargs):
        self.keys[key] = (model_instance, example_inputs)
        return self

    def trace(self, initialize_model_weights=True):
        with _parallel_state().traced_world(self.tp):  # rank 0 of tp, collectives mocked
            return self._trace()

    def _trace(self):
        models, routes, state_names, shapes = {}, {}, None, None
        for key, (instance, examples) in self.keys.items():
            instance.load_module()
            module, aliases = instance.get(0)
            named = dict(module.state_dict(keep_vars=True))
            names = []
            for tensor, out in aliases.items():
                found = [n for n, t in named.items() if t is tensor]
                if not found or not isinstance(out, int):
                    raise ValueError(f"{key}: alias keys must be tensors of the traced module, values output indices")
                names.append(found[0])
            if state_names is None:
                state_names, shapes = names, [tuple(named[n].shape) for n in names]
            elif names != state_names or [tuple(named[n].shape) for n in names] != shapes:
                raise ValueError(f"{key}: every key must alias the same state (names and shapes)")
            groups = _weight_groups(named, state_names)
            weight_names = [names[0] for names in groups]
            self.weight_names, self.dtypes = weight_names, {n: t.dtype for n, t in named.items()}
            self.shapes = {n: tuple(t.shape) for n, t in named.items()}
            self.partitions = _partitions(module)
            self.parameter_names = {n for n, _ in module.named_parameters(remove_duplicate=False)}
            self.first_state = {n: named[n].detach() for n in weight_names}
            xs = list(examples[0])
            ws = [named[n].detach() for n in weight_names]
            st = [named[n].detach() for n in state_names]
            functional = _Functional(module, groups + [[n] for n in state_names])
            rank = torch.zeros(1, dtype=torch.long)
            models[key] = torch.jit.trace(functional, (xs, ws, st, rank), strict=False, check_trace=False)
            routes[shape_key(xs)] = key
        template = [torch.zeros(s, dtype=self.dtypes[n]) for n, s in zip(state_names, shapes, strict=True)]
        private = os.environ.get("NEURON_PORT_STANDIN_PRIVATE_STATE") == "1"
        weight_dtypes = [torch.zeros(0, dtype=self.dtypes[n]) for n in self.weight_names]
        weight_shapes = [list(self.shapes[n]) for n in self.weight_names]
        nxd_model = torch.jit.script(StandInNxDModel(models, routes, self.tp, self.weight_names, weight_dtypes,
                                                     weight_shapes, template, private))
        first = list(next(iter(self.keys.values()))[1][0])
        nxd_model.initialize([self.first_state] * self.tp, torch.tensor([0], dtype=torch.int32))
        executor = torch.jit.trace(NxDModelExecutor(nxd_model), tuple(first), strict=False, check_trace=False)
        executor.nxd_model.weights = [[torch.zeros(0)]]  # traced without weights: initialize brings them
        executor.nxd_model.device_tensors = [{"": torch.zeros(0)}]
        return executor

    def shard_checkpoint(self, serialize_path=None):
        checkpoint = self.loader()
        missing = [n for n in self.weight_names if n not in checkpoint]
        if missing:
            raise KeyError(f"the checkpoint lacks {len(missing)} weights of the traced module, e.g. {missing[:3]}")
        # Stricter than a silent drop: NxD's _parallel_load puts every tensor of a shard on the device,
        # so a tensor the traced module does not name would be HBM spent on nothing (or a name guessed wrong).
        unknown = sorted(k for k in checkpoint if k not in self.dtypes)
        if unknown:
            raise KeyError(f"the checkpoint holds {len(unknown)} tensors the traced module does not have, "
                           f"e.g. {unknown[:3]}")
        # as cast_weights: parameters are cast to the module's dtypes, buffers kept as given; but no cast that
        # changes a value: an int8 weight handed over in another dtype would be truncated, and an fp32 parameter
        # (a quantized layer's scale) handed over narrower has already lost its precision
        for k, v in checkpoint.items():
            if k in self.parameter_names and _lossy_cast(v.dtype, self.dtypes[k]):
                raise TypeError(f"the checkpoint's {k} is {v.dtype}; the traced module's parameter is {self.dtypes[k]}, "
                                "and casting it there would change its values")
        shards = []
        for rank in range(self.tp):  # as shard_children: a split parameter's part for this rank, the rest whole
            kept = {}
            for k, v in checkpoint.items():
                if k in self.partitions:
                    v = _rank_slice(v, *self.partitions[k], rank)
                if tuple(v.shape) != self.shapes[k]:
                    raise RuntimeError(f"expected shape {self.shapes[k]} for {k} but found {tuple(v.shape)}")
                kept[k] = v.to(self.dtypes[k]) if k in self.parameter_names else v
            shards.append(kept)
            if serialize_path is not None:  # safetensors refuses two names sharing memory, as in NxD
                Path(serialize_path).mkdir(parents=True, exist_ok=True)
                save_file({k: v.contiguous() for k, v in kept.items()},
                          str(Path(serialize_path) / f"tp{rank}_sharded_checkpoint.safetensors"))
        return shards
