"""The nxd artifact path end to end, on a stand-in Neuron SDK (``tests/support/sdk_standin``). A contract
test, not a hardware result.

``compile --backend nxd`` traces every graph with one (stand-in) ModelBuilder in one process;
``generate --check`` loads the directory in a fresh process, initialises the executor with the
saved shard and runs the library's step loop over it, the KV store living in the executor's
state. The stand-in follows neuronx-distributed 2.28.0's ModelBuilder API at tp 1 (its README
says what it mirrors); NxD's real parallel layers and sharding run in ``tests/nxd/test_nxd_source.py``.
"""


from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import compile_with_planted_checkpoint, generate_on_standin, run_cli_process, shard_dtypes, standin_env

SHAPE = ["--buckets", "8,16", "--kv-lens", "32"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("nxd") / "A"
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", *SHAPE, "--out", str(out), "--json",
                          env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads(res.stdout)


@pytest.fixture(scope="module")
def nxd_artifact(compiled) -> Path:
    return compiled[0]


def test_the_shard_holds_device_tensors_only_and_matches_the_plan(compiled):
    """No host table on the device (the per-layer embedding alone is 4.7 GB per core on the real E2B);
    the head under its own name; what each core holds agrees with the planner's per-core weights."""
    artifact, summary = compiled
    keys = list(shard_dtypes(artifact))
    assert not [k for k in keys if "embed_tokens" in k], "a host-side embedding table reached the device shard"
    assert "graph.model.lm_head.weight" in keys
    shard, planned = summary["shard_bytes_per_core"], summary["plan_weight_bytes_per_core"]
    assert len(shard) == 1 and abs(shard[0] / planned - 1) < 0.02, (shard, planned)
    assert summary["shard_to_plan"] == round(shard[0] / planned, 4)


# What the strict stand-in refuses, each planted by patching the library's checkpoint in a child:
# the earlier checkpoint (host tables kept, the tied head under the word table's name) and one whose
# buffers were left in float32 beside bf16 parameters (cast_weights casts parameters only).
_PLANTS = {
    "host tables": "state['model.embed_tokens_per_layer.weight'] = model.model.embed_tokens_per_layer.weight.detach()",
    "head under the word table's name": "state['model.embed_tokens.weight'] = state.pop('lm_head.weight')",
    "float32 buffers": "state.update({k: v.float() for k, v in model.named_buffers() if k in state})",
}


def _compile_with(plant: str, out: Path, *extra: str):
    return compile_with_planted_checkpoint(plant, "gemma-4-e2b", "--tiny", "--backend", "nxd", *SHAPE, *extra, "--out", str(out))


@pytest.mark.parametrize("plant,refusal", [("host tables", "tensors the traced module does not have"),
                                           ("head under the word table's name", "lacks 1 weights")])
def test_the_strict_stand_in_refuses_a_checkpoint_that_is_not_the_traced_modules(plant, refusal, tmp_path):
    res = _compile_with(_PLANTS[plant], tmp_path / "A")
    assert res.returncode != 0 and refusal in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "A").exists()


def test_the_strict_stand_in_casts_parameters_only(tmp_path):
    """Buffers in another dtype than the traced graph reach the device as they are, and the executor
    refuses them at load (a compiled graph's inputs have fixed dtypes); the library casts them itself."""
    out = tmp_path / "A"
    res = _compile_with(_PLANTS["float32 buffers"], out, "--dtype", "bf16")
    assert res.returncode == 0, res.stderr[-2000:]
    refused = run_cli_process("generate", str(out), "--prompt-len", "4", "--max-new-tokens", "2", env=standin_env())
    assert refused.returncode != 0 and "not in the dtype the graph was traced with" in refused.stderr
    good = tmp_path / "B"
    assert run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", *SHAPE, "--dtype", "bf16", "--out",
                           str(good), env=standin_env()).returncode == 0
    assert run_cli_process("generate", str(good), "--prompt-len", "4", "--max-new-tokens", "2", env=standin_env()).returncode == 0


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
    out = generate_on_standin(nxd_artifact)
    assert out["backend"] == "nxd"
    assert out["seq_match"] is True and out["self_checks_passed"] is True
    assert out["logit_check"]["steps"] == 12
    assert out["logit_check"]["max_relative_error"] < 1e-4  # float32 through the same HF layers


def test_an_e4b_nxd_artifact_generates_the_reference(tmp_path):
    out = tmp_path / "E4B"
    res = run_cli_process("compile", "gemma-4-e4b", "--tiny", "--backend", "nxd", *SHAPE, "--out", str(out), "--json",
                          env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    assert abs(json.loads(res.stdout)["shard_to_plan"] - 1) < 0.02
    checked = generate_on_standin(out)
    assert checked["seq_match"] is True and checked["self_checks_passed"] is True


def test_the_check_fails_when_the_graphs_do_not_share_the_store(tmp_path):
    """The stand-in made to give each graph its own state: decode reads a store prefill never wrote."""
    out = tmp_path / "A"
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", *SHAPE, "--out", str(out),
                          env=standin_env(NEURON_PORT_STANDIN_PRIVATE_STATE="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    checked = generate_on_standin(out)
    assert checked["self_checks_passed"] is False
    assert checked["logit_check"]["max_relative_error"] > checked["logit_check"]["tolerance"]


LENGTHS = ["--buckets", "4,16", "--kv-lens", "4,16,64"]

# run by a child with the stand-in SDK: the server's slot batch over the artifact, recording the KV length
# of every decode step (SlotBatch.decode_length), then the tokens
_SLOT_BATCH = """
import json, sys
from neuron_port.artifacts.manifest import verify
from neuron_port.artifacts.reader import load_rank_port
from neuron_port.generation.request import GenerationParams
from neuron_port.checks.validation import artifact_prompt
from neuron_port.generation.slots import SlotBatch
directory, n = sys.argv[1], int(sys.argv[2])
prompt = artifact_prompt(directory, 3, 0)  # generate --prompt-len 3's prompt
batch = SlotBatch(load_rank_port(directory, verify(directory), 0), 1)
tokens, lengths = [], []
events = batch.admit([(prompt, GenerationParams(max_new_tokens=n), "r")])
while True:
    tokens += [e.token_id for _, e in events]
    if not batch.active:
        break
    lengths.append(batch.decode_length(batch.active))
    events = batch.step()
print(json.dumps({"tokens": tokens, "lengths": lengths}))
"""


def test_decode_by_length_shares_one_store_and_moves_up_without_a_copy(tmp_path):
    """Three decode keys over ONE aliased store (allocated once, at the largest length): a 3-token prompt
    decodes on the 4-position key (under the tiny E2B's window of 8: its sliding owners are full-length
    there, rings in the store), moves to 16 and then 64 as it grows, and gives the tokens of the
    single-length artifact and of Hugging Face; the server's slot batch picks the same lengths and tokens.
    With a store per key (the stand-in made to give each its own) the move to a longer key loses the
    context, and the check fails."""
    out = tmp_path / "L3"
    res = run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", *LENGTHS, "--out", str(out), "--json",
                          env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    graphs = json.loads((out / "rank0" / "nxd_graphs.json").read_text())["graphs"]
    assert {f: g.get("slot_ids") for f, g in graphs.items() if f.startswith("decode")} == {
        "decode_4.pt": 4, "decode_16.pt": 16, "decode_64.pt": 64}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kv_lens"] == [4, 16, 64] and manifest["runners"]["resident_kv"] is True
    # one store per core, at the largest length: what the planner counts, less than a store per length
    per_length = manifest["kv_layout"][0]
    assert summary["kv_state_bytes_per_core"] == summary["plan_kv_bytes_per_core"] > 0
    assert len(per_length) == 3
    res = run_cli_process("generate", str(out), "--prompt-len", "3", "--max-new-tokens", "40", "--check", "--json",
                          env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    checked = json.loads(res.stdout)
    assert checked["seq_match"] is True and checked["self_checks_passed"] is True
    assert checked["logit_check"]["max_relative_error"] < 1e-4
    lengths = checked["step_kv_lens"]  # step i decodes position 3 + i, holding 4 + i positions
    assert lengths == [4] + [16] * 12 + [64] * 26, lengths
    single = tmp_path / "L1"
    assert run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", "--buckets", "4,16", "--kv-lens", "64",
                           "--out", str(single), env=standin_env()).returncode == 0
    alone = generate_on_standin(single, 40, 3, check=False)
    assert alone["tokens"] == checked["tokens"] and set(alone["step_kv_lens"]) == {64}
    served = subprocess.run([sys.executable, "-c", _SLOT_BATCH, str(out), "40"],
                            capture_output=True, text=True, env=standin_env(), timeout=600)
    assert served.returncode == 0, served.stderr[-3000:]
    slot = json.loads(served.stdout)
    assert slot["tokens"] == checked["tokens"] and slot["lengths"] == lengths

    private = tmp_path / "P"
    assert run_cli_process("compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", *LENGTHS, "--out", str(private),
                           env=standin_env(NEURON_PORT_STANDIN_PRIVATE_STATE="1")).returncode == 0
    broken = generate_on_standin(private, 40, 3)
    assert broken["self_checks_passed"] is False


def test_nxd_artifact_without_the_sdk_is_one_error_line(nxd_artifact):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    res = run_cli_process("generate", str(nxd_artifact), "--prompt-len", "4", "--max-new-tokens", "2", env=env)
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "torch_neuronx" in lines[0], res.stderr
