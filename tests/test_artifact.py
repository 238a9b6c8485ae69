"""Backends and verified artifacts: compile, fresh-process reload, tamper detection, atomic writes."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from neuron_port import describe, load_config
from neuron_port.artifacts import manifest as artifact
from neuron_port.artifacts.writer import write_artifact
from neuron_port.backends.neuron import compiler_args
from neuron_port.backends.nxd import KVResident, alias_map, rank_checkpoints
from neuron_port.generation.generate import generate
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.model.loading import build_model
from neuron_port.parallel.ranks import RankSetup
from tests.helpers import load_rank0_port, run_cli, run_cli_process, write_tiny_artifact


@pytest.fixture(scope="module")
def e2b_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "e2b"
    res = run_cli("compile", "gemma-4-e2b", "--tiny", "--backend", "cpu", "--buckets", "32", "--kv-lens", "64", "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out


def _copy(src, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.slow
def test_tp2_compile_then_generate_in_a_fresh_process(tmp_path):
    out = tmp_path / "e4b_tp2"
    res = run_cli_process("compile", "gemma-4-e4b", "--tiny", "--tp", "2", "--backend", "cpu", "--out", str(out))
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tp"] == 2 and len(manifest["kv_layout"]) == 2
    res = run_cli_process("generate", str(out), "--prompt-len", "24", "--max-new-tokens", "32", "--check", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["seq_match"] is True and d["new_tokens"] == 32 and d["tokens"] == d["reference_tokens"]
    _served_tp2_matches_generate(out)


def _served_tp2_matches_generate(out):
    """The server over a tp 2 artifact (rank 0 in the server, rank 1 stepping with it in lockstep) answers
    two concurrent requests with Hugging Face's greedy tokens."""
    pytest.importorskip("fastapi")
    import concurrent.futures

    import httpx

    from neuron_port.checks.oracle import reference_generate
    from neuron_port.model.loading import load_source
    from tests.helpers import ServerProcess

    prompts = [[2, 17, 33, 5, 92], [2, 41, 7, 300, 12, 58]]
    srv = ServerProcess(str(out))
    try:
        def ask(prompt):
            body = {"model": out.name, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                    "return_token_ids": True}
            return httpx.post(srv.base + "/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            served = list(pool.map(ask, prompts))
    finally:
        assert srv.stop() == 0
    model, _ = load_source("gemma-4-e4b", tiny=True, seed=json.loads((out / "manifest.json").read_text())["source"]["seed"])
    for prompt, tokens in zip(prompts, served, strict=True):  # Hugging Face in this process: no third set of ranks to start
        assert tokens == reference_generate(model, prompt, 12)["tokens"]


def test_fresh_process_check_returns_data_and_names_the_childs_failure(e2b_artifact, tmp_path):
    from neuron_port.checks.validation import check_in_fresh_process
    from neuron_port.errors import ArtifactError

    result = check_in_fresh_process(e2b_artifact, prompt_len=12, max_new_tokens=6)
    assert result["seq_match"] is True and result["tokens"] == result["reference_tokens"] and len(result["tokens"]) == 6
    assert result["self_checks_passed"] is True and result["logit_check"]["steps"] == 6
    assert {c["name"]: c["status"] for c in result["self_checks"]} == {"embeddings": "pass", "attention": "skip",
                                                                        "logits": "pass"}
    broken = _copy(e2b_artifact, tmp_path)
    (broken / "rank0" / "decode_64.pt").write_bytes(b"not a graph")
    with pytest.raises(ArtifactError, match="fresh-process check failed: ArtifactError: .*decode_64.pt"):
        check_in_fresh_process(broken, prompt_len=12, max_new_tokens=6)


def _module_paths_in(directory):
    """Every dotted ``neuron_port`` path an artifact's loader could import: in the manifest, the rank
    JSON files and the saved graphs' code (TorchScript's ``*.debug_pkl`` only holds source lines for
    tracebacks and is never imported). Families paths (``neuron_port.families.<f>:<Class>``) are kept
    where they are on purpose, so they are not listed."""
    import re
    import zipfile

    pattern = re.compile(rb"neuron_port(?:\.\w+)+(?::\w+)?")
    found = set()
    for path in sorted(directory.rglob("*")):
        if path.suffix == ".json":
            found |= set(pattern.findall(path.read_bytes()))
        elif path.suffix == ".pt":
            with zipfile.ZipFile(path) as archive:
                for name in archive.namelist():
                    if not name.endswith(".debug_pkl"):
                        found |= set(pattern.findall(archive.read(name)))
    return sorted(p.decode() for p in found if not p.startswith(b"neuron_port.families."))


def test_an_artifact_names_no_module_a_tree_move_can_break(e2b_artifact, tmp_path):
    """An artifact written before the package moved into layer folders still loads after it: nothing
    it records names a module path other than a family adapter's (which never move). The fresh-process
    check above loads and runs one; this keeps what it depends on true, and the scan finds a planted path."""
    manifest = json.loads((e2b_artifact / "manifest.json").read_text())
    assert manifest["adapter"]["adapter_class"] == "neuron_port.families.gemma4:Gemma4Family"
    assert _module_paths_in(e2b_artifact) == []
    planted = _copy(e2b_artifact, tmp_path)
    (planted / "rank0" / "graph_weights.json").write_text(json.dumps({"runner": "neuron_port.graph.runners:Runners"}))
    assert _module_paths_in(planted) == ["neuron_port.graph.runners:Runners"]


def test_loaded_artifact_equals_the_in_process_port(e2b_artifact):
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    prompt = [2] + list(range(30, 50))
    eager = generate(Port.over_model(model, PortShape([32], [64])), GenerationRequest.greedy([prompt], 20)).tokens
    loaded = load_rank0_port(e2b_artifact)
    assert all(isinstance(r.function, torch.jit.ScriptModule) for r in loaded.runners.decode.values())
    # the saved graphs are the ones the static-shape passes rewrote, and they keep their batch
    assert not any(n.kind() == "aten::size" for r in loaded.runners.decode.values() for n in r.function.graph.nodes())
    assert loaded.batch == 1
    assert generate(loaded, GenerationRequest.greedy([prompt], 20)).tokens == eager
    res = run_cli_process("generate", str(e2b_artifact), "--max-new-tokens", "40", "--check", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["seq_match"] is True


@pytest.mark.parametrize("field,value", [("buckets", [16]), ("tp", 2), ("kv_lens", [128]), ("backend", "neuron"),
                                         ("weights_fingerprint", "0" * 64), ("source", {"kind": "dir", "path": "/x"})])
def test_editing_any_manifest_field_is_refused_by_name(e2b_artifact, tmp_path, field, value):
    art = _copy(e2b_artifact, tmp_path)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest[field] = value
    (art / "manifest.json").write_text(json.dumps(manifest))
    res = run_cli("generate", str(art), "--max-new-tokens", "2")
    assert res.returncode != 0 and res.stdout == ""
    assert f"field {field!r} was edited" in res.stderr


def test_flipping_one_byte_of_a_weights_file_is_refused(e2b_artifact, tmp_path):
    art = _copy(e2b_artifact, tmp_path)
    for rel in ("rank0/weights.safetensors", "embeddings.safetensors", "rank0/decode_64.pt"):
        path = art / rel
        original = path.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        res = run_cli("generate", str(art), "--max-new-tokens", "2")
        assert res.returncode != 0 and f"file {rel}: expected sha256" in res.stderr
        path.write_bytes(original)
    assert run_cli("generate", str(art), "--max-new-tokens", "2").returncode == 0


def test_interrupted_compile_leaves_nothing_generate_accepts(tmp_path, monkeypatch):
    import neuron_port.artifacts.writer as writer

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("simulated interruption")

    monkeypatch.setattr(writer, "compile_rank", boom)  # the host files are written, no rank finishes
    out = tmp_path / "half"
    with pytest.raises(KeyboardInterrupt):
        write_tiny_artifact(build_model(load_config("gemma-4-e2b", tiny=True)), out, {"kind": "shipped"})
    assert not out.exists() and list(tmp_path.iterdir()) == []
    res = run_cli("generate", str(out))
    assert res.returncode != 0 and "not an artifact directory" in res.stderr


def test_killed_compile_process_leaves_no_artifact(tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_port.cli.command", "compile", "gemma-4-12b", "--tiny", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import time

    deadline = time.time() + 60
    while time.time() < deadline and not any(p.name.startswith(".killed.partial") for p in tmp_path.iterdir()):
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert not out.exists()
    for partial in tmp_path.iterdir():  # whatever was left is not accepted
        res = run_cli("generate", str(partial))
        assert res.returncode != 0 and "manifest.json" in res.stderr


def test_version_mismatch_is_refused_unless_overridden(tmp_path, monkeypatch):
    real = artifact.installed_versions()
    monkeypatch.setattr("neuron_port.artifacts.writer.installed_versions", lambda: {**real, "torch": "1.0.0"})
    out = tmp_path / "old"
    write_tiny_artifact(
        build_model(load_config("gemma-4-e2b", tiny=True)),
        out,
        {"kind": "shipped", "name": "gemma-4-e2b", "tiny": True, "seed": 0},
    )
    res = run_cli("generate", str(out), "--max-new-tokens", "2")
    assert res.returncode != 0 and "versions.torch" in res.stderr and "1.0.0" in res.stderr
    assert run_cli("generate", str(out), "--max-new-tokens", "2", "--allow-version-mismatch").returncode == 0


def test_check_refuses_a_reference_with_other_weights(tmp_path):
    out = tmp_path / "wrong_source"
    write_tiny_artifact(
        build_model(load_config("gemma-4-e2b", tiny=True), seed=1),
        out,
        {"kind": "shipped", "name": "gemma-4-e2b", "tiny": True, "seed": 0},
    )
    res = run_cli("generate", str(out), "--max-new-tokens", "4", "--check", "--json")
    assert res.returncode != 0 and "not the artifact's checkpoint" in res.stderr
    assert "seq_match" not in res.stdout


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


def test_neuron_compiler_args():
    assert compiler_args() == ["--model-type", "transformer", "--auto-cast", "none"]
    assert compiler_args("matmult", optimize="O1") == ["--model-type", "transformer", "--auto-cast", "matmult", "-O1"]
    with pytest.raises(ValueError):
        compiler_args("fp8")


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


def test_nxd_alias_map_points_every_kv_parameter_at_its_output():
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    port = Port.over_model(model, PortShape([16], [32]))
    shapes = [t.shape for t in port.inputs.new_store(1, 32)]
    resident = KVResident(port.graphs.decode[32], shapes, torch.float32)
    aliases = alias_map(resident)
    assert sorted(aliases.values()) == list(range(1, len(shapes) + 1))
    inputs = list(port.inputs.example_decode(32)[0])
    out = resident(*inputs)
    for param, index in aliases.items():
        assert out[index].shape == param.shape
    # the graph's own alias list agrees: input 8 + j is output 1 + j
    assert port.graphs.decode[32].aliases == {8 + j: 1 + j for j in range(len(shapes))}


@pytest.mark.neuron
def test_a_neuron_artifact_of_the_tiny_e2b_generates(tmp_path):
    """Runs only where the Neuron SDK is installed (skipped elsewhere with the reason): the single-core
    path is ModelBuilder at tp 1, written as an artifact and run from it."""
    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    write_artifact(
        tmp_path / "A",
        model,
        {"kind": "shipped", "name": "gemma-4-e2b", "tiny": True, "seed": 0},
        RankSetup.for_layout(describe(model), 1),
        PortShape([16], [32]),
        "neuron",
    )
    assert generate(tmp_path / "A", GenerationRequest.greedy([[2, 5, 6, 7]], 8)).tokens


def test_nxd_checkpoint_column_split_gives_each_rank_its_planned_kv_heads():
    """NxD splits columns evenly; the expanded K/V rows make that split equal the library's plan."""
    from neuron_port.backends.nxd import nxd_checkpoint
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


@pytest.mark.slow
def test_a_bf16_artifact_is_checked_against_the_float32_reference(tmp_path):
    """compile --dtype bf16 of a model directory: bf16 files, and generate --check compares with the
    float32 from_pretrained reference (proven the same checkpoint by the fingerprint of its bf16
    cast) within the measured bf16 bound; an artifact of another dtype is refused by --dtype."""
    from safetensors import safe_open

    from neuron_port.checks.selfcheck import REDUCED_PRECISION_LOGIT_TOLERANCE
    from neuron_port.model.loading import build_model
    from neuron_port.model.localdir import write_model_dir

    model_dir, out = tmp_path / "model", tmp_path / "artifact"
    write_model_dir(build_model(load_config("gemma-3", tiny=True), seed=2), model_dir)
    res = run_cli("compile", str(model_dir), "--dtype", "bf16", "--buckets", "16", "--kv-lens", "32", "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["dtype"] == "torch.bfloat16"
    with safe_open(str(out / "embeddings.safetensors"), framework="pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.bfloat16}
    checked = json.loads(run_cli("generate", str(out), "--prompt-len", "8", "--max-new-tokens", "6", "--check", "--json").stdout)
    assert checked["self_checks_passed"] is True and checked["dtype"] == "torch.bfloat16"
    assert checked["logit_check"]["tolerance"] == REDUCED_PRECISION_LOGIT_TOLERANCE
    refused = run_cli("generate", str(out), "--dtype", "fp32", "--prompt-len", "8", "--max-new-tokens", "2")
    assert refused.returncode != 0 and "compiled in torch.bfloat16" in refused.stderr
