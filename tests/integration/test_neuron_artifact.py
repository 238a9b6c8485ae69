"""The single-core Neuron backend takes the documented path: neuronx-distributed's ModelBuilder at tp 1.

``--backend neuron`` writes the artifact ``--backend nxd --tp 1`` writes (recorded as ``neuron``):
weights loaded onto the core once, at ``nxd_model.initialize``, and one KV state for every graph,
both of which ModelBuilder documents. It calls nothing torch-neuronx leaves undocumented: the
stand-in ``torch_neuronx`` (``tests/support/sdk_standin``) has no ``trace``, ``replace_weights`` or
``move_trace_to_device`` at all, so a backend that reached for them would fail here. A contract
test on a stand-in SDK, not a hardware result.
"""


from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neuron_port.backends.neuron import IN_PROCESS_REFUSAL, NeuronBackend
from neuron_port.errors import NeuronPortError
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from tests.helpers import run_cli_process, standin_env

SHAPE = ["--buckets", "8,16", "--kv-lens", "32"]


@pytest.fixture(scope="module")
def neuron_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("neuron") / "A"
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "neuron", *SHAPE, "--out", str(out), "--json",
                          env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads(res.stdout)


def test_the_stand_in_offers_no_undocumented_call():
    code = ("import torch_neuronx as t; import sys; "
            "sys.exit(any(hasattr(t, n) for n in ('trace', 'replace_weights', 'move_trace_to_device')))")
    assert subprocess.run([sys.executable, "-c", code], env=standin_env()).returncode == 0


def test_a_neuron_artifact_is_one_modelbuilder_executor_for_one_core(neuron_artifact):
    out, summary = neuron_artifact
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "neuron" and manifest["tp"] == 1 and manifest["kv_lens"] == [32]
    rank = out / "rank0"
    assert (rank / "model.pt").is_file() and (rank / "weights" / "tp0_sharded_checkpoint.safetensors").is_file()
    assert sorted(json.loads((rank / "nxd_graphs.json").read_text())["graphs"]) == ["decode_32.pt", "prefill_16.pt",
                                                                                    "prefill_8.pt"]
    assert not list(rank.glob("neuron_state*")), "no state bound graph by graph"
    assert abs(summary["shard_to_plan"] - 1) < 0.02


def test_a_neuron_artifact_generates_the_reference_from_a_fresh_process(neuron_artifact):
    out, _ = neuron_artifact
    res = run_cli_process("generate", str(out), "--prompt-len", "10", "--max-new-tokens", "12", "--check", "--json",
                          env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    checked = json.loads(res.stdout)
    assert checked["backend"] == "neuron" and checked["seq_match"] is True and checked["self_checks_passed"] is True
    assert checked["logit_check"]["steps"] == 12 and checked["logit_check"]["max_relative_error"] < 1e-4


def test_port_backend_neuron_is_refused_with_the_artifact_commands(tiny_e2b):
    res = run_cli_process("port", "gemma-4-e2b", "--tiny", "--backend", "neuron", "--max-new-tokens", "2",
                          env=standin_env())
    assert res.returncode != 0 and "compile MODEL --backend neuron" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(NeuronPortError, match="build whole artifacts"):
        Port.over_model(tiny_e2b, PortShape([8], [16])).compile(NeuronBackend())
    assert "neuron-port generate DIR" in IN_PROCESS_REFUSAL and "ModelBuilder at tp 1" in IN_PROCESS_REFUSAL


def test_a_neuron_artifact_takes_one_core(tmp_path):
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "neuron", "--tp", "2", "--out",
                          str(tmp_path / "A"), env=standin_env())
    assert res.returncode != 0 and "--backend nxd" in res.stderr
    assert not (tmp_path / "A").exists()
