"""Contract test of the NxD ModelBuilder calls (neuronx-distributed 2.28.0's ``trace/model_builder.py``
and ``trace/spmd.py``), by a recording stand-in for ModelBuilder. Not a hardware result.

Documented behaviour the stand-in enforces, as the real code does it:
* ``BaseModelInstance(module_cls, input_output_aliases)``: ``load_module()`` sets
  ``self.module = module_cls()``; ``get(bucket_rank)`` returns ``(self.module, aliases)``; the
  builder calls ``load_module`` before ``get`` and traces the module ``get`` returns, with alias
  keys that must be that module's own tensors;
* ``shard_checkpoint`` keeps only checkpoint keys the traced module's ``state_dict`` has
  (``preprocess_checkpoint``) and casts each to the module parameter's dtype (``cast_weights``);
  the library hands it exactly those keys (a test says so), so nothing depends on the drop;
* ``NxDModel.initialize(checkpoint: List[Dict[str, Tensor]], start_rank_tensor)``.
"""


from __future__ import annotations

import sys
import types

import pytest
import torch

from neuron_port.backends import nxd
from neuron_port.backends import nxd_checkpoint as ckpt
from neuron_port.errors import NeuronPortError
from neuron_port.graph.graphs import DecodeGraph, PrefillGraph
from neuron_port.graph.kv import KVStore
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config
from neuron_port.model.layout import describe
from neuron_port.model.loading import build_model
from neuron_port.parallel.ranks import RankSetup
from tests.support.sdk_standin.neuronx_distributed.trace.model_builder import (
    BaseModelInstance,  # NxD's class, as in release 2.28.0
)


class RecordingModelBuilder:
    last = None

    def __init__(self, router, tp_degree, checkpoint_loader, compiler_workdir=None, **kwargs):
        self.tp, self.loader, self.keys = tp_degree, checkpoint_loader, {}
        RecordingModelBuilder.last = self

    def add(self, key, model_instance, example_inputs, compiler_args=None, **kwargs):
        self.keys[key] = (model_instance, example_inputs)
        return self

    def trace(self, initialize_model_weights=True):
        self.traced = {}
        for key, (instance, _) in self.keys.items():
            instance.load_module()
            module, aliases = instance.get(0)
            state = list(module.state_dict(keep_vars=True).values())
            for tensor in aliases:
                if not any(tensor is t for t in state):
                    raise ValueError(f"{key}: an alias key is not a tensor of the traced module")
            self.traced[key] = module
        return torch.nn.Module()

    def shard_checkpoint(self, serialize_path=None):
        module = next(iter(self.traced.values()))
        checkpoint = self.loader()
        names = module.state_dict()
        self.kept = {k: v.to(names[k].dtype) for k, v in checkpoint.items() if k in names}
        return [self.kept] * self.tp


@pytest.fixture
def fake_nxd(monkeypatch):
    builder_module = types.ModuleType("neuronx_distributed.trace.model_builder")
    builder_module.BaseModelInstance = BaseModelInstance
    builder_module.ModelBuilder = RecordingModelBuilder
    for name in ("torch_neuronx", "neuronx_distributed", "neuronx_distributed.trace"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "neuronx_distributed.trace.model_builder", builder_module)
    monkeypatch.setattr(torch.jit, "save", lambda *a, **k: None)
    return builder_module


def _pieces(dtype=torch.float32):
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0, dtype=dtype)
    setup = RankSetup.for_layout(describe(model), 1)
    stores = PortShape(16, 64).stores(setup.layout)
    return model, setup, stores, stores.specs[64], None


def _resident(graph, spec, dtype):
    shapes = [tuple(t.shape) for t in KVStore.zeros(spec, 1, dtype).tensors()]
    return nxd.KVResident(graph, shapes, dtype)


def test_builder_traces_the_module_it_built_with_its_own_aliases(fake_nxd, tmp_path):
    model, setup, stores, spec, _ = _pieces()
    graphs = {"prefill_16": (lambda: _resident(PrefillGraph(nxd.device_copy(model), spec, 16), spec, torch.float32),
                             [torch.zeros(1, 16)]),
              "decode_64": (lambda: _resident(DecodeGraph(nxd.device_copy(model), spec), spec, torch.float32),
                            [torch.zeros(1, 1)])}
    checkpoint = ckpt.traced_checkpoint(model, setup)
    nxd.build(graphs, lambda: checkpoint, 1, tmp_path)
    builder = RecordingModelBuilder.last
    assert set(builder.traced) == {"prefill_16", "decode_64"}
    # the checkpoint is exactly the traced module's tensors (KV is state, not weights): ModelBuilder
    # keeps all of it, and every tensor goes by one name (no tied head to guess a name for)
    for module in builder.traced.values():
        names = [n for n, _ in module.state_dict(keep_vars=True).items() if not n.startswith("kv.")]
        assert sorted(names) == sorted(builder.kept) == sorted(checkpoint)


def test_plain_base_model_instance_aliases_another_modules_tensors(fake_nxd):
    """The old call: aliases computed on one instance, the module rebuilt by load_module."""
    model, setup, stores, spec, _ = _pieces()
    make = lambda: _resident(DecodeGraph(model, spec), spec, torch.float32)  # noqa: E731
    builder = RecordingModelBuilder(None, 1, lambda: {})
    builder.add("decode_64", BaseModelInstance(make, nxd.alias_map(make())), [()])
    with pytest.raises(ValueError, match="not a tensor of the traced module"):
        builder.trace()


def test_checkpoint_keyed_by_checkpoint_names_keeps_nothing(fake_nxd, tmp_path):
    model, setup, stores, spec, _ = _pieces()
    graphs = {"decode_64": (lambda: _resident(DecodeGraph(model, spec), spec, torch.float32), [])}
    nxd.build(graphs, lambda: ckpt.nxd_checkpoint(model, setup), 1, tmp_path)
    builder = RecordingModelBuilder.last
    assert builder.kept == {}  # what the old loader handed ModelBuilder: 0 keys kept
    nxd.build(graphs, lambda: ckpt.traced_checkpoint(model, setup), 1, tmp_path)
    assert len(RecordingModelBuilder.last.kept) > 0


def test_graphs_the_executor_could_not_tell_apart_are_refused(fake_nxd, tmp_path):
    model, setup, stores, spec, _ = _pieces()
    make = lambda: _resident(DecodeGraph(model, spec), spec, torch.float32)  # noqa: E731
    same = [torch.zeros(1, 1)]
    with pytest.raises(ValueError, match="same shapes"):
        nxd.build({"decode_64": (make, same), "prefill_1": (make, same)}, lambda: {}, 1, tmp_path)


def test_bf16_needs_a_bf16_module(fake_nxd, tmp_path):
    """cast_weights casts the checkpoint to the module's dtype: a float32 module undoes a bf16 checkpoint."""
    model, setup, stores, spec, _ = _pieces()
    graphs = {"decode_64": (lambda: _resident(DecodeGraph(nxd.device_copy(model), spec), spec, torch.float32), [])}
    nxd.build(graphs, lambda: ckpt.traced_checkpoint(model, setup, torch.bfloat16), 1, tmp_path)
    assert {v.dtype for v in RecordingModelBuilder.last.kept.values() if v.is_floating_point()} == {torch.float32}
    bf16, setup16, _, spec16, _ = _pieces(torch.bfloat16)
    graphs = {"decode_64": (lambda: _resident(DecodeGraph(nxd.device_copy(bf16), spec16), spec16, torch.bfloat16), [])}
    nxd.build(graphs, lambda: ckpt.traced_checkpoint(bf16, setup16, torch.bfloat16), 1, tmp_path)
    kept = RecordingModelBuilder.last.kept
    assert any(v.dtype == torch.bfloat16 for v in kept.values())


def test_resident_runner_feeds_inputs_only_and_returns_the_store():
    calls = []

    def nxd_model(inputs):
        calls.append([tuple(t.shape) for t in inputs])
        return [torch.ones(1, 4)]

    executor = types.SimpleNamespace(nxd_model=nxd_model)
    runner = nxd.ResidentKVRunner(executor, 4)
    kv = [torch.zeros(2), torch.zeros(3)]
    out = runner(*[torch.zeros(1)] * 4, *kv)
    assert len(calls[0]) == 4 and torch.equal(out[0], torch.ones(1, 4)) and out[1] is kv[0] and out[2] is kv[1]
    # a decode key of 16 positions: its slot ids appended, and a step holding more positions than it reads refused
    keyed = nxd.ResidentKVRunner(executor, 4, slot_ids=16)
    keyed(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.tensor([16]), *kv)
    assert calls[-1][-1] == (16,)
    with pytest.raises(NeuronPortError, match="a decode step of 17 positions on the graph that reads 16"):
        keyed(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.tensor([17]), *kv)


def test_load_initializes_with_every_ranks_shard(monkeypatch, tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "weights").mkdir()
    for r in range(2):
        save_file({"w": torch.full((2,), float(r))}, str(tmp_path / "weights" / f"tp{r}_sharded_checkpoint.safetensors"))
    seen = {}

    class FakeNxDModel:
        def initialize(self, checkpoint, start_rank_tensor):
            seen["ranks"] = [float(c["w"][0]) for c in checkpoint]
            seen["start"] = start_rank_tensor

    executor = types.SimpleNamespace(nxd_model=FakeNxDModel())
    monkeypatch.setitem(sys.modules, "torch_neuronx", types.ModuleType("torch_neuronx"))
    monkeypatch.setitem(sys.modules, "neuronx_distributed", types.ModuleType("neuronx_distributed"))
    monkeypatch.setattr(torch.jit, "load", lambda path: executor)
    assert nxd.load(tmp_path, tp=2) is executor
    assert seen["ranks"] == [0.0, 1.0] and seen["start"].dtype == torch.int32 and int(seen["start"]) == 0


def test_the_device_copy_drops_host_tables_unties_the_head_and_shares_the_rest():
    model, *_ = _pieces()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    device = nxd.device_copy(model)
    assert device.model.embed_tokens is None and device.model.embed_tokens_per_layer is None
    assert device.lm_head.weight is not model.lm_head.weight
    assert device.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()  # the same memory, no copy
    norm = device.model.layers[0].input_layernorm.weight
    assert norm.data_ptr() == model.model.layers[0].input_layernorm.weight.data_ptr()
    assert device.model.layers[0].self_attn.q_proj.weight.is_meta  # replaced by NxD's layers: never copied
    # the original is untouched: tables, tied head, values
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_straddling_plan_is_refused_before_tracing_and_bias_fused_and_int8_pass():
    """Phi-3's tiny 6 q / 3 kv at tp 2 straddles KV groups (one SPMD graph cannot hold per-rank gathers):
    refused by name. Biased (Qwen2), fused (Phi-3 at tp 1) and int8 models with an int8 head are carried."""
    from neuron_port.errors import ShardingError
    from neuron_port.model.quant import apply_quant

    model = build_model(load_config("phi-3", tiny=True), seed=0)
    with pytest.raises(ShardingError, match="straddles KV groups"):
        nxd.check_nxd_supported(model, RankSetup.for_layout(describe(model), 2))
    for ok in ("gemma-4-e2b", "llama", "qwen2", "phi-3"):
        model = build_model(load_config(ok, tiny=True), seed=0)
        nxd.check_nxd_supported(model, RankSetup.for_layout(describe(model), 1))
    model = apply_quant(build_model(load_config("gemma-4-e2b", tiny=True), seed=0), "int8+head")
    nxd.check_nxd_supported(model, RankSetup.for_layout(describe(model), 1))
