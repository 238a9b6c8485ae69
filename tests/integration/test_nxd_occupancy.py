"""Decode by occupancy on the nxd artifact: decode keys for fewer rows beside the full batch's, all over the one
resident store. A lone request runs the 1-row key and two run the 2-row one (NxD's executor routes a step by its
inputs' shapes), their tokens Hugging Face's; a planted fault (the row graphs' write back into the store dropped)
fails the same comparison. Run in fresh processes with the stand-in SDK, at tp 1 and tp 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import STANDIN_SHAPE, standin_env

pytestmark = pytest.mark.slow

_PLANT = """
import neuron_port.graph.graphs as graphs
original = graphs.OneHotCache.__init__
def planted(self, *args, **kwargs):
    original(self, *args, **kwargs)
    if self.read_rows is not None:
        self.keys, self.values = list(self.keys), list(self.values)
        update = graphs.OneHotCache.update
        def keep(key_states, value_states, layer_idx, *a, **k):
            j = self.index[layer_idx]
            saved = self.keys[j], self.values[j]
            out = update(self, key_states, value_states, layer_idx, *a, **k)
            self.keys[j], self.values[j] = saved  # the step's rows never reach the store
            return out
        self.update = keep
graphs.OneHotCache.__init__ = planted
"""

_COMPILE = "import sys\n{plant}\nfrom neuron_port.cli.command import main\nsys.exit(main(sys.argv[1:]))\n"

_RUN = """
import json, sys
from pathlib import Path
from neuron_port.artifacts.manifest import verify
from neuron_port.artifacts.reader import load_rank_port
from neuron_port.checks.oracle import reference_generate
from neuron_port.generation.request import GenerationParams
from neuron_port.model.loading import model_from_name
from tests.helpers import record_decode_rows, run_slot_schedule

artifact = Path(sys.argv[1])
port = load_rank_port(artifact, verify(artifact), 0)
used = record_decode_rows()
model = model_from_name("gemma-4-e2b", tiny=True, seed=0)
prompts = [[2, 5, 9, 11], [2, 40, 41, 42, 43, 44], [2, 300, 301]]
alone = run_slot_schedule(port, [(0, prompts[0], GenerationParams(8))], 4)[0]
alone_rows = sorted(set(used))
used.clear()
pair = run_slot_schedule(port, [(0, p, GenerationParams(8)) for p in prompts[:2]], 4)
pair_rows = sorted(set(used))
used.clear()
trio = run_slot_schedule(port, [(0, p, GenerationParams(8)) for p in prompts], 4)
print(json.dumps({"alone": alone, "alone_rows": alone_rows, "pair": [pair[0], pair[1]], "pair_rows": pair_rows,
                  "trio": [trio[i] for i in range(3)], "trio_rows": sorted(set(used)),
                  "reference": [reference_generate(model, p, 8).tokens for p in prompts],
                  "decode_rows": port.runners.facts()["decode_rows"]}))
"""


def _compile(out, tp: int, plant: str = "") -> None:
    args = ["compile", "gemma-4-e2b", "--tiny", "--backend", "nxd", "--tp", str(tp), *STANDIN_SHAPE, "--batch", "4",
            "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", _COMPILE.format(plant=plant), *args], capture_output=True, text=True,
                          env=standin_env(), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def _run(out) -> dict:
    done = subprocess.run([sys.executable, "-c", _RUN, str(out)], capture_output=True, text=True, env=standin_env(),
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tp", [1, 2])
def test_a_lone_request_runs_the_one_row_key_over_the_one_store(tmp_path, tp):
    _compile(tmp_path / "art", tp)
    graphs = json.loads((tmp_path / "art" / "rank0" / "nxd_graphs.json").read_text())["graphs"]
    assert {"decode_32_rows1.pt", "decode_32_rows2.pt", "decode_32.pt"} <= set(graphs)
    result = _run(tmp_path / "art")
    assert result["decode_rows"] == [1, 2]
    assert result["alone_rows"] == [1] and result["pair_rows"] == [2] and result["trio_rows"] == [4]
    assert result["alone"] == result["reference"][0]
    assert result["pair"] == result["reference"][:2]
    assert result["trio"] == result["reference"]  # three rows: the full batch's key


def test_row_graphs_that_drop_their_write_back_fail_the_tokens(tmp_path):
    _compile(tmp_path / "art", 1, plant=_PLANT)
    result = _run(tmp_path / "art")
    assert result["alone_rows"] == [1]
    assert result["alone"] != result["reference"][0]

