"""Single-core Neuron backend: ``torch_neuronx.trace``, saved with ``torch.jit.save``.

Needs the AWS Neuron SDK (``torch-neuronx`` from the Neuron repository); imported only inside
the functions below. The calls follow the torch-neuronx API reference (SDK 2.28); they have not
run on hardware in this project's CI, and :mod:`tests.test_neuron_contract` checks what is
handed to the tracer against that reference.

* The KV store is a set of parameters of the module handed to the tracer (:class:`KVResident`),
  and ``input_output_aliases`` maps those very tensors to their output indices, as NxD Inference
  does: torch-neuronx keys aliases by the traced module's own tensors (matched with
  ``torch.equal``), not by input positions. The runner (:class:`ResidentKVRunner`) hands the graph
  the step inputs only.
* Weights are kept out of the neff (``inline_weights_to_neff=False``) and every graph of a rank is
  bound to one state with ``torch_neuronx.replace_weights``: the same weight tensors and the same
  KV tensors, so prefill writes the store decode reads. A rank's graphs therefore share one KV
  length. The state is saved once (``neuron_state.safetensors``) and bound again on load.
  Whether the runtime keeps one device copy of tensors bound to several traced modules is a
  hardware question this CI cannot answer; ``generate --check`` compares every step's logits
  with the reference and fails if prefill's writes do not reach decode. neuronx-distributed's
  ModelBuilder (``nxd``, any tp including 1) documents one state for all its graphs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from neuron_port.backends.nxd import KVResident, ResidentKVRunner, alias_map
from neuron_port.backends.sdk import require_backend
from neuron_port.errors import NeuronPortError
from neuron_port.graph.step import INPUT_NAMES

STATE_FILE = "neuron_state.safetensors"
STATE_ALIASES = "neuron_state_aliases.json"


def compiler_args(auto_cast: str = "none", model_type: str = "transformer", optimize: str | None = None,
                  extra: Sequence[str] = ()) -> list[str]:
    """``neuronx-cc`` arguments. ``auto_cast``: none | matmult | all (the compiler's choices)."""
    if auto_cast not in ("none", "matmult", "all"):
        raise ValueError(f"auto_cast must be none, matmult or all; found {auto_cast!r}")
    args = ["--model-type", model_type, "--auto-cast", auto_cast]
    if optimize:
        args.append(f"-{optimize}" if not optimize.startswith("-") else optimize)
    return args + list(extra)


class NeuronBackend:
    name = "neuron"

    def __init__(self, auto_cast: str = "none"):
        self.args = compiler_args(auto_cast)
        self.state: dict[str, torch.Tensor] = {}  # the one state bound to every graph compiled here

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int],
                options: dict[str, Any] | None = None) -> ResidentKVRunner:
        """``aliases`` (input index -> output index) says which inputs are the KV store: they become
        parameters of the traced module, aliased by those tensors."""
        require_backend("neuron")
        import torch_neuronx

        first = min(aliases)
        kv = list(example_inputs[first:])
        resident = KVResident(graph, [t.shape for t in kv], kv[0].dtype)
        args = list((options or {}).get("compiler_args", self.args))
        traced = torch_neuronx.trace(resident, tuple(example_inputs[:first]), compiler_args=args,
                                     input_output_aliases=alias_map(resident), inline_weights_to_neff=False)
        torch_neuronx.replace_weights(traced, self._bind(resident.state_dict()))
        return ResidentKVRunner(traced, first)

    def _bind(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The rank's one state for a graph's names: the first graph's tensors for every later one."""
        for name, tensor in state.items():
            held = self.state.setdefault(name, tensor)
            if held.shape != tensor.shape:
                raise NeuronPortError(f"{name}: {tuple(tensor.shape)} here, {tuple(held.shape)} in the rank's first graph; "
                                      "the neuron backend binds one KV store to all of a rank's graphs, so they take one "
                                      "KV length (compile with a single --kv-lens value)")
        return {name: self.state[name] for name in state}

    def save_graphs(self, files: dict[str, ResidentKVRunner], rank_dir: Path,
                    named_tensors: dict[str, torch.Tensor]) -> list[Path]:
        """Every traced graph, and the rank's state once (a tensor under two names saved once)."""
        from safetensors.torch import save_file

        paths = []
        for file, runner in files.items():
            torch.jit.save(runner.executor, str(rank_dir / file))
            paths.append(rank_dir / file)
        first: dict[tuple, str] = {}
        aliases = {}
        for name, tensor in self.state.items():  # state_dict() detaches: a tied tensor is the same memory, not object
            owner = first.setdefault((tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride())), name)
            if owner != name:
                aliases[name] = owner
        save_file({n: t.detach().contiguous() for n, t in self.state.items() if n not in aliases}, str(rank_dir / STATE_FILE))
        (rank_dir / STATE_ALIASES).write_text(json.dumps(aliases))
        return paths + [rank_dir / STATE_FILE, rank_dir / STATE_ALIASES]

    def load_graphs(self, rank_dir: Path, files: list[str], host: dict[str, torch.Tensor]) -> dict[str, ResidentKVRunner]:
        """Every graph loaded and bound to one state read once."""
        require_backend("neuron")
        import torch_neuronx
        from safetensors.torch import load_file

        state = load_file(str(rank_dir / STATE_FILE))
        state.update({alias: state[name] for alias, name in json.loads((rank_dir / STATE_ALIASES).read_text()).items()})
        runners = {}
        for file in files:
            traced = torch.jit.load(str(rank_dir / file))
            torch_neuronx.replace_weights(traced, state)
            runners[file] = ResidentKVRunner(traced, len(INPUT_NAMES))
        return runners


__all__ = ["NeuronBackend", "compiler_args"]
