"""The nxd artifact path end to end, on a stand-in Neuron SDK (``tests/sdk_standin``). A contract
test, not a hardware result.

``compile --backend nxd`` traces every graph with one (stand-in) ModelBuilder in one process;
``generate --check`` loads the directory in a fresh process, initialises the executor with the
saved shard and runs the library's step loop over it, the KV store living in the executor's
state. The stand-in follows neuronx-distributed 2.28.0's ModelBuilder API at tp 1 (its README
says what it mirrors); NxD's real parallel layers and sharding run in ``tests/test_nxd_source.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import run_cli_process

STANDIN = str(Path(__file__).parent / "sdk_standin")
SHAPE = ["--buckets", "8,16", "--kv-lens", "32"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([STANDIN, str(Path(__file__).resolve().parents[1])])
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def nxd_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nxd") / "A"
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", *SHAPE, "--out", str(out), "--json",
                          env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _generate(artifact: Path) -> dict:
    res = run_cli_process("generate", str(artifact), "--prompt-len", "10", "--max-new-tokens", "12", "--check", "--json",
                          env=_env())
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return json.loads(res.stdout)


def test_nxd_artifact_layout(nxd_artifact):
    manifest = json.loads((nxd_artifact / "manifest.json").read_text())
    assert manifest["backend"] == "nxd" and manifest["tp"] == 1 and manifest["kv_lens"] == [32]
    rank = nxd_artifact / "rank0"
    assert (rank / "model.pt").is_file() and (rank / "weights" / "tp0_sharded_checkpoint.safetensors").is_file()
    graphs = json.loads((rank / "nxd_graphs.json").read_text())["graphs"]
    assert sorted(graphs) == ["decode_32.pt", "prefill_16.pt", "prefill_8.pt"]
    assert not list(nxd_artifact.rglob("compiler*")), "the compiler's work directory stays outside the artifact"
    assert not (nxd_artifact / "rank1").exists()


def test_nxd_artifact_generates_the_reference_from_a_fresh_process(nxd_artifact):
    out = _generate(nxd_artifact)
    assert out["backend"] == "nxd"
    assert out["seq_match"] is True and out["self_checks_passed"] is True
    assert out["logit_check"]["steps"] == 12
    assert out["logit_check"]["max_relative_error"] < 1e-4  # float32 through the same HF layers


def test_the_check_fails_when_the_graphs_do_not_share_the_store(tmp_path):
    """The stand-in made to give each graph its own state: decode reads a store prefill never wrote."""
    out = tmp_path / "A"
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", *SHAPE, "--out", str(out),
                          env=_env(NEURON_PORT_STANDIN_PRIVATE_STATE="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    checked = _generate(out)
    assert checked["self_checks_passed"] is False
    assert checked["logit_check"]["max_relative_error"] > checked["logit_check"]["tolerance"]


def test_nxd_artifact_takes_one_kv_length(tmp_path):
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", "--buckets", "8", "--kv-lens", "16,32",
                          "--out", str(tmp_path / "A"), env=_env())
    assert res.returncode != 0
    assert "one KV length" in res.stderr and "[16, 32]" in res.stderr
    assert not (tmp_path / "A").exists()


def test_nxd_artifact_without_the_sdk_is_one_error_line(nxd_artifact):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    res = run_cli_process("generate", str(nxd_artifact), "--prompt-len", "4", "--max-new-tokens", "2", env=env)
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "torch_neuronx" in lines[0], res.stderr
