"""Real TP execution on CPU: sharded Hugging Face Gemma-4 modules, as threads and as gloo processes."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from neuron_port import load_config
from neuron_port.checks.oracle import reference_generate
from neuron_port.errors import ParallelRankError
from neuron_port.families import family_for
from neuron_port.generation.generate import generate
from neuron_port.generation.logits import softcap
from neuron_port.generation.request import GenerationRequest
from neuron_port.graph.shapes import PortShape
from neuron_port.model.configs import load_config_dict, tiny_config_dict
from neuron_port.model.loading import build_model
from neuron_port.parallel.launch import CHILD_ENV, run_gloo, run_in_process
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]


def _prompt(vocab, n=24, seed=1000):
    ids = torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    ids[0] = 2
    return ids


def _compare(model, tp, in_process):
    prompt = _prompt(model.config.vocab_size)
    ref = reference_generate(model, prompt, 48, [])
    got = generate(
        model,
        GenerationRequest.greedy([prompt], 48, keep_logits=True),
        shape=PortShape([32], 128),
        tp=tp,
        mode="threads" if in_process else "gloo",
    )
    assert got.tokens[0] == ref["tokens"]
    port_logits = softcap(torch.stack(got.step_logits)[:, 0], model.config.final_logit_softcapping)
    ref_logits = torch.stack(ref["logits"])
    rel = (port_logits - ref_logits).abs().max() / ref_logits.abs().max()
    assert rel < 1e-4, f"logits differ by {rel:.2e} relative"
    return got


@pytest.mark.slow
@pytest.mark.parametrize("name,tp,in_process", [("gemma-4-e4b", 2, False), ("gemma-4-12b", 2, False), ("gemma-4-12b", 4, True)])
def test_ranks_match_hugging_face(name, tp, in_process):
    """gloo processes at tp 2; tp 4 as threads (four spawned interpreters cost ~20 s on two cores, and the
    process path is the same code at any tp)."""
    model = build_model(load_config(name, tiny=True), seed=0)
    got = _compare(model, tp, in_process=in_process)
    assert len(got.per_rank_kv_cache_bytes) == tp
    assert not got.rank_disagreement


def test_threaded_ranks_straddling_kv_groups_with_real_modules():
    """6 q / 3 kv heads at tp 2: ranks straddle a KV group; the static gather path runs in HF's modules."""
    text = tiny_config_dict(load_config_dict("gemma-4-e4b"))
    text.update(num_attention_heads=6, num_key_value_heads=3)
    config = family_for(text["model_type"]).make_config(text)
    model = build_model(config, seed=0)
    _compare(model, 2, in_process=True)


def test_threaded_ranks_e2b_replicated_single_kv_head():
    _compare(build_model(load_config("gemma-4-e2b", tiny=True), seed=0), 2, in_process=True)


def _die_on_rank_one(rank, reduce):
    if rank == 1:
        raise RuntimeError("injected failure")
    return {"rank": rank}


def _sum_ranks(rank, reduce):
    return reduce(torch.tensor([float(rank + 1)])).tolist()


def _raising_line() -> int:
    import inspect

    source, start = inspect.getsourcelines(_die_on_rank_one)
    return start + next(i for i, line in enumerate(source) if "raise" in line)


def test_gloo_all_reduce_and_rank_failure(tmp_path, monkeypatch):
    """The failing rank is named with the file, line and function that raised, and its whole traceback;
    torch's per-rank error files do not pile up in the temp folder."""
    assert run_gloo(_sum_ranks, 2) == [[3.0], [3.0]]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where this process's temp files go now
    with pytest.raises(ParallelRankError) as caught:
        run_gloo(_die_on_rank_one, 2)
    assert not list(tmp_path.rglob("pytorch-errorfile-*")), "the error files were left behind"
    where = f"rank 1 of 2 failed at {__file__}:{_raising_line()} in _die_on_rank_one: "
    assert str(caught.value).startswith(where), str(caught.value)
    assert caught.value.rank == 1 and "Traceback" in caught.value.rank_traceback


def test_threaded_rank_failure_is_reported():
    with pytest.raises(ParallelRankError) as caught:
        run_in_process(_die_on_rank_one, 2)
    assert str(caught.value).startswith(f"rank 1 of 2 failed at {__file__}:{_raising_line()} in _die_on_rank_one: ")


def test_a_script_without_a_main_guard_is_told_what_to_add(tmp_path):
    """Each gloo rank imports the main script again: an unguarded launch must say so, in one message."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from neuron_port.parallel.launch import run_gloo\n"
        "from tests.test_tp_execution import _sum_ranks\n"
        "print(run_gloo(_sum_ranks, 2))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()
    assert f"ParallelRankError: the script {script} starts tensor-parallel ranks when it is imported" in proc.stderr
    assert last[-2:] == ['    if __name__ == "__main__":', "        main()"]


def test_no_respawn_inside_a_worker(monkeypatch):
    monkeypatch.setenv(CHILD_ENV, "1")
    with pytest.raises(ParallelRankError, match="re-spawn"):
        run_gloo(_sum_ranks, 2)
    assert os.environ[CHILD_ENV] == "1"


def test_shard_plan_cli_12b():
    res = run_cli("shard-plan", "gemma-4-12b", "--tp", "2", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    for layer in plan["layers"]:
        if layer["attention"] == "sliding":
            assert [len(r["kv_heads"]) for r in layer["ranks"]] == [4, 4]
        else:
            assert [r["kv_heads"] for r in layer["ranks"]] == [[0], [0]]


def test_shard_plan_cli_bad_degree():
    res = run_cli("shard-plan", "gemma-4-e4b", "--tp", "3")
    assert res.returncode != 0
    assert "valid tp degrees: [1, 2, 4, 8]" in res.stderr
