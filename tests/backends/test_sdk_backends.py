"""The neuron, nxd and xla backends without their SDKs: one clear error each, and what they hand the SDK
(compiler flags, checkpoints, alias maps)."""


import pytest
import torch

from neuron_port import describe, load_config
from neuron_port.artifacts.writer import write_artifact
from neuron_port.backends.neuron import NeuronBackend
from neuron_port.backends.nxd import KVResident, alias_map
from neuron_port.backends.nxd_artifact import NxdBackend
from neuron_port.backends.nxd_checkpoint import rank_checkpoints
from neuron_port.errors import ArtifactError
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.graph.step import INPUT_NAMES
from neuron_port.model.loading import build_model
from neuron_port.model.source import Source
from neuron_port.parallel.ranks import RankSetup
from tests.helpers import run_cli, run_cli_process


def test_neuron_backends_fail_fast_without_the_sdk(tmp_path):
    for cmd in (["port", "gemma-4-e2b", "--tiny"], ["compile", "gemma-4-e2b", "--tiny", "--out", str(tmp_path / "x")]):
        res = run_cli(*cmd, "--backend", "neuron")
        assert res.returncode != 0
        assert "pip.repos.neuron.amazonaws.com" in res.stderr and "WRONG PACKAGE" in res.stderr
    assert not (tmp_path / "x").exists()


def test_nxd_needs_the_sdk_and_neuron_refuses_tensor_parallelism(tmp_path):
    """compile --backend nxd without the SDK: one error line naming the Neuron packages; --backend
    neuron --tp 2: refused before any work, naming nxd; xla graphs are not saved as artifacts."""
    out = tmp_path / "x"
    res = run_cli("compile", "gemma-4-e4b", "--tiny", "--tp", "2", "--backend", "nxd", "--out", str(out))
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "torch_neuronx" in lines[0] and "neuronx-distributed" in lines[0] and "pip.repos.neuron.amazonaws.com" in lines[0]
    for cmd in (["compile", "gemma-4-e4b", "--tiny", "--out", str(out)], ["port", "gemma-4-e4b", "--tiny"]):
        res = run_cli(*cmd, "--tp", "2", "--backend", "neuron")
        assert res.returncode == 2 and res.stderr.count("\n") == 1
        assert "--backend neuron compiles for one NeuronCore and cannot run tp 2" in res.stderr and "--backend nxd" in res.stderr
    res = run_cli("port", "gemma-4-e2b", "--tiny", "--backend", "nxd")
    assert res.returncode == 2 and "invalid choice: 'nxd'" in res.stderr  # port checks in process: cpu, neuron, xla
    res = run_cli("compile", "gemma-4-e2b", "--tiny", "--out", str(out), "--backend", "xla")
    assert res.returncode == 2 and "invalid choice: 'xla'" in res.stderr
    assert not out.exists()


def test_nxd_rank_checkpoints_keep_buffers_and_cast():
    model = build_model(load_config("gemma-4-12b", tiny=True), seed=0)
    layout = describe(model)
    ranks = rank_checkpoints(model, RankSetup.for_layout(layout, 2), layer_dtype=torch.bfloat16)
    assert len(ranks) == 2
    for state in ranks:
        scalars = [k for k in state if k.endswith("layer_scalar")]
        assert len(scalars) == layout.num_layers
        for k in scalars:
            assert torch.equal(state[k].float(), model.state_dict()[k].to(torch.bfloat16).float())
            assert state[k].float().item() != 1.0
        assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.bfloat16}
    # sliding layer 0: 8 KV heads -> 4 per rank; full layer 5: its one KV head on both ranks
    assert ranks[0]["model.layers.0.self_attn.k_proj.weight"].shape[0] == 4 * 16
    assert torch.equal(ranks[0]["model.layers.5.self_attn.k_proj.weight"], ranks[1]["model.layers.5.self_attn.k_proj.weight"])


def test_nxd_alias_map_points_every_kv_parameter_at_its_output(tiny_e2b):
    port = Port.over_model(tiny_e2b, PortShape([16], [32]))
    shapes = [t.shape for t in port.inputs.new_store(1, 32)]
    resident = KVResident(port.graphs.decode[32], shapes, torch.float32)
    aliases = alias_map(resident)
    assert sorted(aliases.values()) == list(range(1, len(shapes) + 1))
    inputs = list(port.inputs.example_decode(32)[0])
    out = resident(*inputs)
    for param, index in aliases.items():
        assert out[index].shape == param.shape
    # the graph's own alias list agrees: input len(INPUT_NAMES) + j is output 1 + j
    first = len(INPUT_NAMES)
    assert port.graphs.decode[32].aliases == {first + j: 1 + j for j in range(len(shapes))}


@pytest.mark.neuron
def test_a_neuron_artifact_of_the_tiny_e2b_generates(tiny_e2b, tmp_path):
    """Runs only where the Neuron SDK is installed (skipped elsewhere with the reason): the single-core
    path is ModelBuilder at tp 1, written as an artifact and run from it."""
    write_artifact(
        tmp_path / "A",
        tiny_e2b,
        Source.shipped("gemma-4-e2b", tiny=True),
        RankSetup.for_layout(describe(tiny_e2b), 1),
        PortShape([16], [32]),
        "neuron",
    )
    assert generate(tmp_path / "A", GenerationRequest.greedy([[2, 5, 6, 7]], 8)).tokens


def test_nxd_checkpoint_column_split_gives_each_rank_its_planned_kv_heads():
    """NxD splits columns evenly; the expanded K/V rows make that split equal the library's plan."""
    from neuron_port.backends.nxd_checkpoint import nxd_checkpoint
    from neuron_port.errors import ShardingError
    from neuron_port.parallel.sharding import expanded_kv_rows, head_rows, plan_attention

    model = build_model(load_config("gemma-4-12b", tiny=True), seed=0)
    layout = describe(model)
    for tp in (2, 4):
        setup = RankSetup.for_layout(layout, tp)
        state = nxd_checkpoint(model, setup, layer_dtype=torch.bfloat16)
        plan = setup.plan
        for spec in layout.layers:
            k = state[f"model.layers.{spec.index}.self_attn.k_proj.weight"]
            original = model.state_dict()[f"model.layers.{spec.index}.self_attn.k_proj.weight"]
            for rank, part in zip(plan.layers[spec.index].plan.ranks, k.chunk(tp, dim=0), strict=True):
                assert torch.equal(part.float(), head_rows(original, rank.kv_heads, spec.head_dim).to(torch.bfloat16).float())
        assert sum(key.endswith("layer_scalar") for key in state) == layout.num_layers
    with pytest.raises(ShardingError):
        expanded_kv_rows(torch.zeros(2 * 4, 8), plan_attention(6, 2, 3), 4)  # ranks hold 1, 2 and 1 KV heads


def test_nxd_parallel_layers_need_the_sdk():
    from neuron_port.backends.nxd import parallelize_for_nxd
    from neuron_port.errors import BackendUnavailableError

    model = build_model(load_config("gemma-4-e4b", tiny=True), seed=0)
    with pytest.raises(BackendUnavailableError, match="pip.repos.neuron.amazonaws.com"):
        parallelize_for_nxd(model, RankSetup.for_layout(describe(model), 2))


def test_xla_without_torch_xla_is_one_line_naming_it():
    try:
        import torch_xla  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("torch-xla is installed here; this checks the refusal where it is not")
    res = run_cli_process("port", "gemma-4-e2b", "--tiny", "--backend", "xla", "--json")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert (
        res.stderr.startswith("error: backend 'xla' needs torch-xla")
        and "pip install torch==2.8.0 torch-xla==2.8.0" in res.stderr
    )


def test_the_backend_loads_what_nxd_loads_and_refuses_an_earlier_per_graph_artifact(tmp_path):
    assert issubclass(NeuronBackend, NxdBackend) and NeuronBackend.name == "neuron"
    (tmp_path / "decode_32.pt").write_bytes(b"an earlier per-graph trace")
    with pytest.raises(ArtifactError, match="rebuild it with 'neuron-port compile MODEL --backend neuron"):
        NeuronBackend().load_graphs(tmp_path, ["decode_32.pt"], {})

