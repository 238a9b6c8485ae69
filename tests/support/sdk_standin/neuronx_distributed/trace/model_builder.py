"""Stand-in of neuronx-distributed 2.28.0's ModelBuilder at tp 1 (see tests/support/sdk_standin/README.md).

Each key's module is traced by TorchScript as a function of (inputs, weights, state), so the
saved executor holds no weights and runs exactly the ones ``initialize`` hands it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn


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

    def forward(self, xs: list[torch.Tensor], ws: list[torch.Tensor], st: list[torch.Tensor]):
        for names, tensor in zip(self.groups, [*ws, *st], strict=True):
            for name in names:
                owner, leaf = self._owner(name)
                object.__setattr__(owner, leaf, tensor)
        return list(self.inner[0](*xs))


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
    def __init__(self, models: dict[str, nn.Module], routes: dict[str, str], weight_names: list[str],
                 weight_dtypes: list[torch.Tensor], state_template: list[torch.Tensor], private_state: bool):
        super().__init__()
        self.models = nn.ModuleDict(models)
        self.routes = routes
        self.weight_names = weight_names
        self.state_template = state_template
        self.private_state = private_state
        self.weight_dtypes: list[torch.Tensor] = weight_dtypes  # empty tensors of the traced dtypes
        self.weights: list[torch.Tensor] = [torch.zeros(0)]
        self.device_tensors: dict[str, torch.Tensor] = {"": torch.zeros(0)}
        self.state: dict[str, list[torch.Tensor]] = {"": [torch.zeros(0)]}

    @torch.jit.export
    def initialize(self, checkpoint: list[dict[str, torch.Tensor]], start_rank_tensor: torch.Tensor):
        if len(checkpoint) != 1 or int(start_rank_tensor[0]) != 0:
            raise RuntimeError("the stand-in runs one rank: expected one checkpoint and start rank 0")
        # as _parallel_load: every tensor of the shard goes to the device, named by the module or not
        self.device_tensors = checkpoint[0]
        weights: list[torch.Tensor] = []
        for i in range(len(self.weight_names)):
            name = self.weight_names[i]
            if name not in checkpoint[0]:
                raise RuntimeError("the shard lacks the traced weight " + name)
            tensor = checkpoint[0][name]
            if tensor.dtype != self.weight_dtypes[i].dtype:
                raise RuntimeError("the shard's " + name + " is not in the dtype the graph was traced with")
            weights.append(tensor)
        self.weights = weights
        state: dict[str, list[torch.Tensor]] = {}
        for key in self.routes.values():
            state[key] = [t.clone() for t in self.state_template]
        state[""] = [t.clone() for t in self.state_template]
        self.state = state

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        key = self.routes[shape_key(inputs)]
        slot = key if self.private_state else ""
        out: list[torch.Tensor] = [torch.zeros(0)]
        for name, model in self.models.items():
            if name == key:
                out = model(inputs, self.weights, self.state[slot])
        self.state[slot] = out[1:]
        return out[:1]


class NxDModelExecutor(nn.Module):
    def __init__(self, nxd_model):
        super().__init__()
        self.nxd_model = nxd_model

    def forward(self, *inputs):
        return self.nxd_model(list(inputs))


class ModelBuilder:
    def __init__(self, router, tp_degree, checkpoint_loader, compiler_workdir=None, **kwargs):
        if tp_degree != 1:
            raise NotImplementedError(f"the stand-in ModelBuilder runs tp 1 only, found tp_degree={tp_degree}")
        self.tp, self.loader, self.keys = tp_degree, checkpoint_loader, {}

    def add(self, key, model_instance, example_inputs, compiler_args=None, **kwargs):
        self.keys[key] = (model_instance, example_inputs)
        return self

    def trace(self, initialize_model_weights=True):
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
            self.parameter_names = {n for n, _ in module.named_parameters(remove_duplicate=False)}
            self.first_state = {n: named[n].detach() for n in weight_names}
            xs = list(examples[0])
            ws = [named[n].detach() for n in weight_names]
            st = [named[n].detach() for n in state_names]
            functional = _Functional(module, groups + [[n] for n in state_names])
            models[key] = torch.jit.trace(functional, (xs, ws, st), strict=False, check_trace=False)
            routes[shape_key(xs)] = key
        template = [torch.zeros(s, dtype=self.dtypes[n]) for n, s in zip(state_names, shapes, strict=True)]
        private = os.environ.get("NEURON_PORT_STANDIN_PRIVATE_STATE") == "1"
        weight_dtypes = [torch.zeros(0, dtype=self.dtypes[n]) for n in self.weight_names]
        nxd_model = torch.jit.script(StandInNxDModel(models, routes, self.weight_names, weight_dtypes, template, private))
        first = list(next(iter(self.keys.values()))[1][0])
        nxd_model.initialize([self.first_state], torch.tensor([0], dtype=torch.int32))
        executor = torch.jit.trace(NxDModelExecutor(nxd_model), tuple(first), strict=False, check_trace=False)
        executor.nxd_model.weights = [torch.zeros(0)]  # traced without weights: initialize brings them
        executor.nxd_model.device_tensors = {"": torch.zeros(0)}
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
        kept = {k: (v.to(self.dtypes[k]) if k in self.parameter_names else v) for k, v in checkpoint.items()}
        if serialize_path is not None:  # safetensors refuses two names sharing memory, as in NxD
            Path(serialize_path).mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in kept.items()},
                      str(Path(serialize_path) / "tp0_sharded_checkpoint.safetensors"))
        return [kept]
