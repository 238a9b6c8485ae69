"""One copy of a rank's weights for every compiled CPU graph of it, on disk and in memory.

A frozen TorchScript graph holds its weights as constants, so a rank with four graphs (three
prompt buckets and one KV length) saved with ``torch.jit.save`` carries its weights four times,
and reloading them holds four copies. Here each saved graph is the frozen graph with its large
tensor constants turned into trailing inputs (:func:`lift_constants`): the graph file holds
code and small constants only, the tensors go once into the rank's ``weights.safetensors``
(:class:`WeightPool`, deduplicated across graphs by the memory they view, then by content), and
each graph's file records which pooled tensors it takes, in order. :func:`bind_graphs` loads
the pool once and hands every graph the same tensors (:class:`BoundGraph`).

Tensors the artifact already holds elsewhere (the host's word-embedding table, which a tied LM
head reads) are not pooled: they are named ``host:<name>`` and bound from the host copy;
``host:<name>.T`` is that table transposed (the decode graphs' pre-transposed head,
:func:`neuron_port.backends.static_graph_passes.pretranspose_wide_linears`), made once at load.

Layout of a rank directory::

    weights.safetensors          every pooled tensor, once
    graph_weights.json           {graph file: [entry, ...]} in input order: a pooled or host
                                 tensor's name, or a view of one ({"view_of", "shape", "stride", "offset"})
    graph_weight_specs.json      {graph file: [[dtype, shape], ...]}: checked for every bound tensor
    prefill_32.pt, decode_256.pt ...   lifted graphs (torch.jit.save of a ScriptFunction)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from neuron_port.model.tensorfile import SAFETENSORS_DTYPES, read_header, read_tensors

LIFT_MIN_BYTES = 256
"""Tensor constants at least this large leave the graph for the pool; smaller ones (scalars,
norm offsets) stay inline, where an extra call argument would cost more than they weigh."""

POOL_FILE = "weights.safetensors"
INDEX_FILE = "graph_weights.json"
SPEC_FILE = "graph_weight_specs.json"
HOST_PREFIX = "host:"


def view_key(t: torch.Tensor) -> tuple:
    """The memory a tensor views: two tensors with equal keys are the same values."""
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)


_VIEW_OPS = {"aten::to", "aten::view", "aten::reshape", "aten::select", "aten::slice", "aten::expand", "aten::t",
             "aten::transpose", "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::as_strided", "aten::detach",
             "aten::contiguous", "aten::type_as", "aten::view_as", "aten::expand_as", "aten::narrow"}


def _written_in_place(value) -> bool:
    """Whether an in-place op (``aten::*_``) writes ``value`` or a view of it. (TorchScript's alias
    analysis answers yes for any value that reaches a list or an op of unknown aliasing, which
    includes attributes the graph only reads.)"""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        for use in v.uses():
            kind = use.user.kind()
            if kind.startswith("aten::") and kind.endswith("_") and use.offset == 0:
                return True
            if kind in _VIEW_OPS and use.offset == 0:
                todo.extend(use.user.outputs())
    return False


def lift_constants(frozen: torch.jit.ScriptModule, min_bytes: int = LIFT_MIN_BYTES
                   ) -> tuple[torch.jit.ScriptFunction, list[torch.Tensor]]:
    """A frozen module's forward as a function whose large tensor constants are trailing inputs.

    Returns (function, tensors): ``function(*inputs, *tensors)`` computes ``frozen(*inputs)``.
    Tensor attributes freezing left as reads are lifted as well; any other read of the module
    (a graph that was not frozen) is refused."""
    graph = frozen.graph.copy()
    lifted: list[torch.Tensor] = []
    for node in list(graph.nodes()):
        if node.kind() != "prim::Constant" or not isinstance(node.output().type(), torch._C.TensorType):
            continue
        value = node.output().toIValue()
        if not isinstance(value, torch.Tensor) or value.numel() * value.element_size() < min_bytes:
            continue
        arg = graph.addInput()
        arg.setType(node.output().type())
        node.output().replaceAllUsesWith(arg)
        node.destroy()
        lifted.append(value)
    module_self = next(graph.inputs())
    for use in list(module_self.uses()):
        # Freezing can leave a tensor attribute read (the straddling ranks' KV-head gathers): lift it too.
        node = use.user
        if node.kind() != "prim::GetAttr" or not isinstance(node.output().type(), torch._C.TensorType):
            raise ValueError(f"lift_constants needs a frozen graph; this one still reads the module ({node.kind()})")
        if _written_in_place(node.output()):
            # freezing keeps an attribute the graph writes: shared by every graph of the pool, one
            # graph's writes would show in the others
            raise ValueError(f"lift_constants: the graph writes its attribute {node.s('name')!r} in place; "
                             "such state cannot be shared through the weight pool")
        arg = graph.addInput()
        arg.setType(node.output().type())
        node.output().replaceAllUsesWith(arg)
        lifted.append(getattr(frozen, node.s("name")))
        node.destroy()
    graph.eraseInput(0)
    return torch._C._create_function_from_graph("forward", graph), lifted


class WeightPool:
    """Named tensors, each stored once however many graphs take it.

    ``named``: {name: tensor} for tensors with a known name (the rank's state dict; host tables
    as ``host:<name>``); ``transposed``: {view key of a copy: view key of its source} for
    pre-transposed copies, named ``<source name>.T``. :meth:`add` returns a tensor's entry: its
    pooled name, or ``{"view_of": name, "shape", "stride", "offset"}`` for a view of a named
    tensor's memory (the frozen graph's transpose of a tied head reads the word table itself)."""

    def __init__(self, named: Mapping[str, torch.Tensor], transposed: Mapping[tuple, tuple] | None = None):
        self.named = dict(named)
        self.names = {view_key(t): name for name, t in self.named.items()}
        self._storages: dict[int, list[str]] = {}
        for name, t in self.named.items():
            if t.is_contiguous():
                self._storages.setdefault(t.untyped_storage().data_ptr(), []).append(name)
        self.transposed = dict(transposed or {})
        self.tensors: dict[str, torch.Tensor] = {}
        self._by_view: dict[tuple, str | dict] = {}
        self._by_content: dict[tuple, str] = {}

    def _name_for(self, key: tuple) -> str | None:
        if key in self.names:
            return self.names[key]
        source = self.transposed.get(key)
        if source is not None and source in self.names:
            return self.names[source] + ".T"
        return None

    def _view_entry(self, tensor: torch.Tensor) -> dict | None:
        """A view of a named contiguous tensor of the same dtype whose elements hold every element
        the view reads; None when there is none (the tensor is then pooled by value)."""
        if tensor.numel() == 0:
            return None
        lowest = tensor.storage_offset()
        highest = lowest + sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride(), strict=True))
        for base_name in self._storages.get(tensor.untyped_storage().data_ptr(), []):
            base = self.named[base_name]
            start = base.storage_offset()
            if base.dtype == tensor.dtype and start <= lowest and highest < start + base.numel():
                return {"view_of": self.add(base), "shape": list(tensor.shape), "stride": list(tensor.stride()),
                        "offset": lowest - start}
        return None

    def add(self, tensor: torch.Tensor) -> str | dict:
        """The entry of ``tensor``: an existing one when the same values are pooled already."""
        key = view_key(tensor)
        if key in self._by_view:
            return self._by_view[key]
        entry: str | dict | None = None if key in self.names else self._view_entry(tensor)
        if entry is None:
            raw = tensor.detach().contiguous()
            digest = hashlib.blake2b(raw.view(-1).view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()
            content = (str(tensor.dtype), tuple(tensor.shape), digest)
            entry = self._by_content.get(content)
            if entry is None:
                entry = self._name_for(key) or f"constant.{len(self.tensors)}"
                self._by_content[content] = entry
                if not entry.startswith(HOST_PREFIX):
                    self.tensors[entry] = raw
        self._by_view[key] = entry
        return entry

    def save(self, path: Path) -> None:
        """Every pooled tensor once; tensors viewing memory another already uses are copied
        (safetensors refuses shared memory)."""
        seen: set[int] = set()
        out = {}
        readable = set(SAFETENSORS_DTYPES.values())
        for name, t in self.tensors.items():
            if t.dtype not in readable:
                raise TypeError(f"pooled tensor {name!r} has dtype {t.dtype}, which the artifact reader does not "
                                f"read (expected one of {sorted(str(d) for d in readable)})")
            ptr = t.untyped_storage().data_ptr()
            out[name] = t.clone() if ptr in seen else t
            seen.add(ptr)
        save_file(out, str(path))


def save_lifted(graphs: Mapping[str, torch.jit.ScriptModule], rank_dir: Path, pool: WeightPool) -> list[Path]:
    """Lift, pool and save every frozen graph ({file name: graph}); returns the files written."""
    rank_dir.mkdir(parents=True, exist_ok=True)
    index: dict[str, list[str | dict]] = {}
    specs: dict[str, list[list]] = {}
    paths = []
    for file, frozen in graphs.items():
        function, tensors = lift_constants(frozen)
        index[file] = [pool.add(t) for t in tensors]
        specs[file] = [[str(t.dtype), list(t.shape)] for t in tensors]
        function.save(str(rank_dir / file))
        paths.append(rank_dir / file)
    pool.save(rank_dir / POOL_FILE)
    (rank_dir / INDEX_FILE).write_text(json.dumps(index, indent=1))
    (rank_dir / SPEC_FILE).write_text(json.dumps(specs))
    return paths + [rank_dir / POOL_FILE, rank_dir / INDEX_FILE, rank_dir / SPEC_FILE]


class BoundGraph:
    """A lifted graph with its tensors bound: ``bound(*inputs)`` is the original graph's call."""

    def __init__(self, function, tensors: Sequence[torch.Tensor]):
        self.function = function
        self.tensors = tuple(tensors)

    def __call__(self, *inputs: torch.Tensor):
        return self.function(*inputs, *self.tensors)


def _host_tensor(name: str, host: Mapping[str, torch.Tensor], made: dict[str, torch.Tensor]) -> torch.Tensor:
    """A ``host:`` entry: the host table itself, or (``.T``) its transpose, made once."""
    base = name[len(HOST_PREFIX):]
    if base in host:
        return host[base]
    if base.endswith(".T") and base[:-2] in host:
        if base not in made:
            made[base] = host[base[:-2]].t().contiguous()
        return made[base]
    raise KeyError(f"graph tensor {name!r}: the artifact's host tables have {sorted(host)}")


def _entry_tensor(entry: str | dict, pooled: Mapping[str, torch.Tensor], host: Mapping[str, torch.Tensor],
                  made: dict[str, torch.Tensor]) -> torch.Tensor:
    if isinstance(entry, dict):
        base = _entry_tensor(entry["view_of"], pooled, host, made)
        return base.as_strided(entry["shape"], entry["stride"], base.storage_offset() + int(entry["offset"]))
    if entry.startswith(HOST_PREFIX):
        return _host_tensor(entry, host, made)
    if entry not in pooled:
        raise KeyError(f"graph tensor {entry!r} is not in the rank's {POOL_FILE}")
    return pooled[entry]


def bind_graphs(rank_dir: Path, files: Sequence[str], host: Mapping[str, torch.Tensor]) -> dict[str, BoundGraph]:
    """Load the pool once and every graph in ``files`` bound to it; ``host``: the host tables
    ({name: tensor}) that ``host:`` names refer to."""
    import neuron_port.parallel.collectives  # noqa: F401  (registers the all-reduce op traced graphs call)

    index = json.loads((rank_dir / INDEX_FILE).read_text())
    specs = json.loads((rank_dir / SPEC_FILE).read_text())
    header = read_header(rank_dir / POOL_FILE)
    pooled = read_tensors(rank_dir / POOL_FILE, {k: k for k in header[0] if k != "__metadata__"}, header)
    made: dict[str, torch.Tensor] = {}
    out = {}
    for file in files:
        if file not in index:
            raise KeyError(f"{rank_dir / INDEX_FILE} lists no tensors for graph {file}")
        tensors = [_entry_tensor(e, pooled, host, made) for e in index[file]]
        for i, (tensor, (dtype, shape)) in enumerate(zip(tensors, specs[file], strict=True)):
            if str(tensor.dtype) != dtype or list(tensor.shape) != shape:
                raise ValueError(f"{rank_dir.name}/{file}: input tensor {i} ({index[file][i]}) expected {dtype} "
                                 f"{shape}, found {tensor.dtype} {list(tensor.shape)}")
        out[file] = BoundGraph(torch.jit.load(str(rank_dir / file), map_location="cpu"), tensors)
    return out


__all__ = [
    "LIFT_MIN_BYTES",
    "POOL_FILE",
    "view_key",
    "INDEX_FILE",
    "SPEC_FILE",
    "HOST_PREFIX",
    "lift_constants",
    "WeightPool",
    "save_lifted",
    "BoundGraph",
    "bind_graphs",
]
