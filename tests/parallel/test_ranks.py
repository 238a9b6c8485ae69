"""Ranks on CPU: threads over real sharded modules, gloo all-reduce, rank failures reported, the main guard."""


import os
import subprocess
import sys
import tempfile

import pytest
import torch

from neuron_port.errors import ParallelRankError
from neuron_port.families import family_for
from neuron_port.model.configs import load_config_dict, tiny_config_dict
from neuron_port.model.loading import build_model
from neuron_port.parallel.launch import CHILD_ENV, run_gloo, run_in_process
from tests.helpers import ROOT, ranks_match_hf


def test_threaded_ranks_straddling_kv_groups_with_real_modules():
    """6 q / 3 kv heads at tp 2: ranks straddle a KV group; the static gather path runs in HF's modules."""
    text = tiny_config_dict(load_config_dict("gemma-4-e4b"))
    text.update(num_attention_heads=6, num_key_value_heads=3)
    config = family_for(text["model_type"]).make_config(text)
    model = build_model(config, seed=0)
    ranks_match_hf(model, 2, in_process=True)


def test_threaded_ranks_e2b_replicated_single_kv_head(tiny_e2b):
    ranks_match_hf(tiny_e2b, 2, in_process=True)


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
        "from tests.parallel.test_ranks import _sum_ranks\n"
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
