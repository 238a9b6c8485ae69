"""XLA backend: the port's graphs recorded and run through torch-xla, the layer torch-neuronx uses.

On an Inferentia2 host, ``torch_neuronx.trace`` and neuronx-distributed's ModelBuilder record
graphs through torch-xla, lower them to XLA HLO and hand that to neuronx-cc. With
``PJRT_DEVICE=CPU`` the same lowering runs here, on XLA's CPU device. This backend keeps the
graphs, their weights and the KV store on the XLA device:

* one sync per step (host inputs go to the device, the step runs, the logits come back); a store
  still pending when a step starts is materialised by one more, as a small graph of its own (an xla
  port's graphs all take the one store whole, so on that path none is);
* the weights are moved once: every graph of a model reads the same device buffers (the report's
  ``weight_copies`` and ``weight_bytes_to_device``);
* the store's tensors are written back in place after every step, so XLA aliases (donates) them
  to the step's outputs and the store stays resident;
* graphs run under ``no_grad``, never ``inference_mode`` (lazy tensors cannot be inference tensors);
* with ``setup`` at tp > 1: SPMD over tp CPU devices (``xr.use_spmd()``, a 1-D ``tp`` mesh); the
  weights are annotated from the setup's shard plan (q, k, v, gate, up split by rows; o, down by
  columns; norms, embeddings' LM head and the rest replicated) and the store by KV head, so device
  r holds exactly rank r's shard of every split weight (see :mod:`neuron_port.backends.spmd`) and XLA's
  partitioner writes the all-reduce.

:class:`LoweringRecorder` keeps the facts of the lowering: compiles (cached and not), aten
fallbacks, and per graph its HLO instruction and opcode counts, aliased buffers and memory traffic
(:mod:`neuron_port.backends.hlo_cost`), read from the optimized (for SPMD: partitioned, so per
device) modules XLA dumps; the longest decode graph's traffic is set against its minimum.
torch-xla is imported inside this module's functions only; without it, :class:`XlaBackend` raises
one line saying how to install it.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from neuron_port.backends.hlo_cost import CLASSES, decode_cost, traffic
from neuron_port.backends.hlo_text import HloSummary, summarize
from neuron_port.backends.leading_update import leading_update
from neuron_port.errors import BackendUnavailableError, NeuronPortError
from neuron_port.graph.kv import KVWrite
from neuron_port.graph.step import INPUT_NAMES

XLA_HINT = ("install torch-xla beside the matching torch, in its own virtualenv (torch-xla 2.8 needs torch 2.8): "
            "pip install torch==2.8.0 torch-xla==2.8.0, then run with PJRT_DEVICE=CPU")
_PROCESS: dict[str, Any] = {}  # XLA's runtime is per process: its device count and dump folder are fixed once


def _prepare_process(xla: Any, devices: int) -> Path | None:
    """What XLA reads when its runtime starts in this process: the CPU device count and a folder
    to dump optimized HLO into (ours, emptied as it is read and removed at exit, unless
    ``XLA_FLAGS`` names one). Returns the dump folder, None when HLO cannot be observed (the runtime
    started before this backend without one)."""
    if "devices" in _PROCESS:
        if _PROCESS["devices"] != devices:
            raise NeuronPortError(f"this process's XLA runtime already runs {_PROCESS['devices']} device(s); "
                                  f"a {devices}-device backend needs a new process")
        return _PROCESS["dump"]
    flags = os.environ.get("XLA_FLAGS", "")
    named = Path(flags.split("--xla_dump_to=", 1)[1].split()[0]) if "--xla_dump_to=" in flags else None
    if xla._XLAC._xla_runtime_is_initialized():
        import torch_xla.runtime as xr

        running = xr.global_runtime_device_count()
        if running != devices:
            raise NeuronPortError(f"this process's XLA runtime started with {running} device(s) before the backend; "
                                  f"a {devices}-device backend needs a new process")
        _PROCESS.update(devices=devices, dump=named if "--xla_dump_hlo_as_text" in flags else None, ours=False)
        return _PROCESS["dump"]
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ["CPU_NUM_DEVICES"] = str(devices)
    dump = named or Path(tempfile.mkdtemp(prefix="neuron_port_hlo_"))
    if named is None:
        flags += f" --xla_dump_to={dump}"
        atexit.register(shutil.rmtree, dump, ignore_errors=True)
    if "--xla_dump_hlo_as_text" not in flags:
        flags += " --xla_dump_hlo_as_text"
    os.environ["XLA_FLAGS"] = flags.strip()
    _PROCESS.update(devices=devices, dump=dump, ours=named is None)
    return dump


def require_xla() -> Any:
    """``torch_xla``, or BackendUnavailableError with the install hint."""
    try:
        import torch_xla
    except Exception as exc:  # ImportError, or a torch-xla built for another torch
        raise BackendUnavailableError(f"backend 'xla' needs torch-xla, which is not usable here ({exc!r}); {XLA_HINT}") from None
    return torch_xla


class LoweringRecorder:
    """Compile counters since the backend started, and per graph what compiled when it ran.

    A graph whose compiled program came from XLA's in-process cache (the same graph compiled
    earlier in this process) compiles nothing here, so nothing is known of its HLO: the report
    lists it under ``kv_tensors`` without HLO facts, and the lint says it was not observed.
    """

    def __init__(self, dump: Path | None, ours: bool):
        import torch_xla.debug.metrics as met

        self.met, self.dump, self.ours = met, dump, ours
        self.start = self.counters()
        self.graphs: dict[str, dict[str, Any]] = {}
        self._read: set[str] = set(self._dumped())

    def counters(self) -> dict[str, int]:
        """Every torch-xla counter now (compiles, cache hits, aten fallbacks, ...)."""
        return {name: self.met.counter_value(name) or 0 for name in self.met.counter_names()}

    def _compile_state(self) -> tuple[int, float]:
        compile_time = self.met.metric_data("CompileTime")
        return self.met.counter_value("UncachedCompile") or 0, compile_time[1] if compile_time else 0.0

    def _dumped(self) -> list[str]:
        return sorted(glob.glob(str(self.dump / "*after_optimizations.txt"))) if self.dump is not None else []

    def _take_new_modules(self) -> list[tuple[HloSummary, dict[str, int]]]:
        """(summary, traffic) of each optimized module dumped since the last call; our own dump folder
        is emptied after."""
        new = [f for f in self._dumped() if f not in self._read]
        texts = [Path(f).read_text() for f in new]
        summaries = [(summarize(text), traffic(text)) for text in texts]
        self._read.update(new)
        if self.ours:  # XLA also dumps LLVM IR and objects per fusion: read what we need, drop the rest
            for path in self.dump.iterdir():
                path.unlink(missing_ok=True) if path.is_file() else shutil.rmtree(path, ignore_errors=True)
            self._read.clear()
        return summaries

    def watch(self, name: str, step) -> Any:
        """Run ``step()``; what it compiled (if anything) is recorded under ``name`` (two counter
        reads per step when nothing compiles)."""
        before, ns_before = self._compile_state()
        result = step()
        after, ns_after = self._compile_state()
        if after > before:
            modules = self._take_new_modules()
            total, moved = HloSummary(), dict.fromkeys((*CLASSES, "total"), 0)
            for m, bytes_of in modules:
                total.instructions += m.instructions
                total.opcodes.update(m.opcodes)
                total.aliased_buffers += m.aliased_buffers
                total.dynamic_dimensions += m.dynamic_dimensions
                total.int8_parameters += m.int8_parameters
                total.int8_parameter_bytes += m.int8_parameter_bytes
                total.int8_converts += m.int8_converts
                moved = {k: moved[k] + bytes_of[k] for k in moved}
            self.graphs[name] = {"compiles": after - before, "compile_s": round((ns_after - ns_before) / 1e9, 3),
                                 "hlo": total.to_json() if modules else None, "traffic": moved if modules else None}
        return result

    def report(self, devices: int, kv_tensors: dict[str, int]) -> dict[str, Any]:
        """The lowering report (the ``xla`` field of ``neuron-port port --json``)."""
        now = self.counters()
        fallbacks = {k: now[k] - self.start.get(k, 0) for k in now if k.startswith("aten::") and now[k] > self.start.get(k, 0)}
        hlo = {name: g["hlo"] for name, g in self.graphs.items() if g["hlo"] is not None}
        return {
            "devices": devices,
            "graphs": len(self.graphs),
            "uncached_compiles": now.get("UncachedCompile", 0) - self.start.get("UncachedCompile", 0),
            "cached_compiles": now.get("CachedCompile", 0) - self.start.get("CachedCompile", 0),
            "fallback_ops": fallbacks,
            "hlo_instructions": {name: h["instructions"] for name, h in hlo.items()},
            "hlo_opcodes": {name: h["opcodes"] for name, h in hlo.items()},
            "aliased_buffers": {name: h["aliased_buffers"] for name, h in hlo.items()},
            "dynamic_dimensions": {name: h["dynamic_dimensions"] for name, h in hlo.items()},
            "int8_weights": {name: {"parameters": h["int8_parameters"], "bytes": h["int8_parameter_bytes"],
                                    "converts": h["int8_converts"]} for name, h in hlo.items()},
            "kv_tensors": dict(kv_tensors),
            "compile_s": {name: g["compile_s"] for name, g in self.graphs.items()},
            "hlo_traffic": {name: g["traffic"] for name, g in self.graphs.items() if g["traffic"] is not None},
        }


class XlaRunner:
    """One graph on the XLA device: ``runner(*step_inputs, *store) -> (logits on the host, *store)``.

    The two things the lowering needs are attributes so that a test can turn either off and show
    what breaks: ``write_back`` (the new K/V copied into the store's own tensors, which makes XLA
    alias them; without it the store is copied in and out of every step) and ``sync_each_step``
    (one ``torch_xla.sync()`` per step; without it every step records all earlier ones again).
    """

    write_back = True
    sync_each_step = True

    def __init__(self, backend: XlaBackend, name: str, graph: nn.Module, kv_tensors: int):
        self.backend, self.name, self.graph, self.kv_tensors = backend, name, graph, kv_tensors

    def _sync(self) -> None:
        if self.sync_each_step:
            self.backend.xla.sync()

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        backend = self.backend
        n = len(INPUT_NAMES)
        kv = [t if t.device.type == "xla" else backend.place_kv(t) for t in args[n:]]
        if any(id(t) not in backend.resident for t in kv if t.device.type == "xla") and args[n].device.type == "xla":
            # a store computed between steps is still a pending computation: it runs as its own small graph
            backend.recorder.watch(f"kv_view_{self.name.split('_')[-1]}", self._sync)
        inputs = [x.to(backend.device) for x in args[:n]]

        def step() -> tuple[torch.Tensor, ...]:
            out = self.graph(*inputs, *kv)
            if not self.write_back:
                self._sync()
                return out
            for buf, new in zip(kv, out[1:], strict=True):
                buf.copy_(new)  # written back in place: XLA aliases the store to the outputs
            self._sync()
            return (out[0], *kv)

        out = backend.recorder.watch(self.name, step)
        backend.ran[self.name] = self.kv_tensors
        backend.resident = {id(t) for t in out[1:]}
        return (out[0].cpu(), *out[1:])


class XlaBackend:
    """Graphs kept and run on an XLA device (CPU PJRT here); SPMD over ``setup.tp`` devices at tp > 1."""

    name = "xla"
    fixed_batch = True  # a new batch would be a new graph shape: a new compile
    inference_mode = False

    def __init__(self, setup=None, kv_write: KVWrite = KVWrite.ROWS, prefill_update: bool = True):
        """``kv_write``: ``ROWS``, decode scatters its new rows into the aliased store (graph.kv.row_write),
        returned and written back outside the graph; ``BLEND`` rewrites the whole store (what every decode
        graph did before, kept for the decode_cost benchmark). Never ``IN_PLACE``: a lazy graph returns
        what it writes.
        ``prefill_update``: a prefill writes its prompt rows by one dynamic-update-slice
        (:func:`~neuron_port.backends.leading_update.leading_update`); False lowers ``slice_scatter`` (a
        select over each buffer), kept to measure the difference."""
        self.setup = setup
        if KVWrite(kv_write) is KVWrite.IN_PLACE:
            raise ValueError(f"the xla backend's decode returns the store it writes: expected kv_write "
                             f"{KVWrite.ROWS.value!r} or {KVWrite.BLEND.value!r}, found {KVWrite.IN_PLACE.value!r}")
        self.kv_write = KVWrite(kv_write)
        self.leading_update = leading_update if prefill_update else None
        self.devices = setup.tp if setup is not None else 1
        self.xla = require_xla()  # before anything is changed: without torch-xla, one line and nothing else
        dump = _prepare_process(self.xla, self.devices)
        import torch_xla.runtime as xr

        if self.devices > 1:
            import numpy as np
            import torch_xla.distributed.spmd as xs

            if not _PROCESS.get("spmd"):
                xr.use_spmd()
                _PROCESS["spmd"] = True
            self.xs = xs
            self.mesh = xs.Mesh(np.arange(self.devices), (self.devices,), ("tp",))
        self.device = self.xla.device()
        self.recorder = LoweringRecorder(dump, bool(_PROCESS.get("ours")))
        self._placed: set[int] = set()
        self.weight_bytes_to_device = 0  # parameters and buffers of every model moved to the device
        self.ran: dict[str, int] = {}  # graph name -> KV tensors it takes, for every graph that ran
        self.resident: set[int] = set()  # the store tensors the last step left on the device
        # decode graph name -> (store spec, batch, weight bytes, dtype bytes, readers of each owner's K/V)
        self.decode_graphs: dict[str, tuple[Any, int, int, int, dict[int, int]]] = {}

    def place_kv(self, tensor: torch.Tensor) -> torch.Tensor:
        """A store tensor moved to the device, split by KV head over the mesh at tp > 1."""
        out = tensor.to(self.device)
        if self.devices > 1:
            self.xs.mark_sharding(out, self.mesh, (None, "tp", None, None))
        return out

    def _place_model(self, model: nn.Module) -> None:
        if id(model) in self._placed:
            return
        tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
        self.weight_bytes_to_device += sum(t.numel() * t.element_size() for t in tensors)
        model.to(self.device)
        if self.devices > 1:
            from neuron_port.backends.spmd import weight_splits

            for weight, spec in weight_splits(model, self.setup):
                self.xs.mark_sharding(weight, self.mesh, spec)
        self._placed.add(id(model))

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int],
                options: dict[str, Any] | None = None) -> XlaRunner:
        """Move the graph (and the model it runs) to the device; XLA compiles on the first call."""
        self._place_model(graph.model)
        for name, buf in list(graph.named_buffers(recurse=False)):
            setattr(graph, name, buf.to(self.device))
        kind = graph.kind
        name = f"{kind}_{graph.spec.kv_len if kind == 'decode' else graph.seq}"
        if kind == "decode" and graph.rows is not None:  # a decode graph over the store's first rows
            name += f"_rows{graph.rows}"
        elif kind == "decode":
            self.decode_graphs[name] = (graph.spec, example_inputs[0].shape[0], *self._device_weight_bytes(graph.model))
        return XlaRunner(self, name, graph, len(aliases))

    def _device_weight_bytes(self, model: nn.Module) -> tuple[int, int, dict[int, int]]:
        """(the weight bytes one device must read per decode step, bytes per element, the layers
        reading each owner's K/V): the planner's per-core count (:mod:`neuron_port.parallel.per_core`)
        at this backend's degree, int8 projections at one byte plus their scales."""
        from neuron_port.model.layout import describe
        from neuron_port.model.quant import quant_of
        from neuron_port.parallel.per_core import core_params

        layout = self.setup.layout if self.setup is not None else describe(model)
        dtype_bytes = next(model.parameters()).element_size()  # int8 projections are buffers, not parameters
        weights = core_params(layout, model.config, self.devices).weight_bytes(dtype_bytes, quant_of(model))
        return weights, dtype_bytes, layout.kv_readers()

    def decode_cost(self) -> dict[str, Any] | None:
        """The traffic of the longest decode graph whose HLO was seen, against the least a decode step at
        its KV length must move (:func:`neuron_port.backends.hlo_cost.decode_cost`), per device; None
        when no decode graph was observed."""
        seen = {name: g["traffic"] for name, g in self.recorder.graphs.items() if g["traffic"] is not None}
        observed = [name for name in self.decode_graphs if name in seen]
        if not observed:
            return None
        name = max(observed, key=lambda n: self.decode_graphs[n][0].kv_len)
        spec, batch, weight_bytes, dtype_bytes, readers = self.decode_graphs[name]
        return {"graph": name, **decode_cost(seen[name], weight_bytes, spec, spec.kv_len, batch, dtype_bytes, readers)}

    def report(self) -> dict[str, Any]:
        """What the lowering of every graph run so far looked like (see :class:`LoweringRecorder`),
        with the weights moved to the device: ``weight_copies`` (models placed: 1 when every graph
        reads the same device weight buffers) and ``weight_bytes_to_device``; and ``decode_cost``
        (:meth:`decode_cost`)."""
        return {**self.recorder.report(self.devices, self.ran), "weight_copies": len(self._placed),
                "weight_bytes_to_device": self.weight_bytes_to_device, "decode_cost": self.decode_cost()}

    def save(self, runnable: Any, path: Path) -> None:
        raise NeuronPortError("xla graphs are lowered and checked in process (neuron-port port --backend xla); "
                              "an artifact needs a backend that saves its graphs (cpu, neuron)")

    def load(self, path: Path) -> Any:
        self.save(None, path)


__all__ = ["XLA_HINT", "require_xla", "LoweringRecorder", "XlaRunner", "XlaBackend"]
