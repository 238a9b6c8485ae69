"""Shared test helpers."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root."""


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run ``neuron-port ARGS`` in this process (fast), capturing its output."""
    from neuron_port.cli.command import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
    return CliResult(code, out.getvalue(), err.getvalue())


def run_cli_process(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> CliResult:
    """Run ``neuron-port ARGS`` as a fresh process (``env``: its whole environment; default ours)."""
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_port", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


_COMMANDS_SCRIPT = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
from tests.helpers import run_cli
print(json.dumps([dataclasses.astuple(run_cli(*args)) for args in json.loads(sys.argv[2])]))
"""


def run_cli_commands(*commands: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> list[CliResult]:
    """:func:`run_cli` for several ``neuron-port`` commands one after another in one fresh process
    (``env``: its whole environment): one interpreter start instead of one per command."""
    import json

    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", _COMMANDS_SCRIPT, root, json.dumps([list(c) for c in commands])],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [CliResult(*result) for result in json.loads(proc.stdout)]


class ServerProcess:
    """``neuron-port serve ARGS`` on a free 127.0.0.1 port, started and stopped by the test. Its output goes to a
    file (a pipe nobody reads would fill with the access log and stall the server): :meth:`output`."""

    def __init__(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None):
        import socket
        import tempfile
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="neuron-port-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neuron_port", "serve", *args, "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, text=True, env=env,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.output()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not become healthy in time")

    def output(self) -> str:
        """What the server printed so far (its log lines, then whatever it said on leaving)."""
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, sig: int | None = None) -> int:
        """Send ``sig`` (default SIGTERM: a drain) and wait for the exit; its status."""
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if sig is None else sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def run_cli_json(*args: str):
    """``neuron-port ARGS --json`` in this process; the parsed JSON (asserting a zero exit)."""
    import json

    res = run_cli(*args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


WRONG_EMBED_SCALE = 2.1e-25


def break_embed_scale(monkeypatch) -> None:
    """Make ``neuron_port.model.loading.load_model_dir`` leave the word embedding's scale wrong (as it once
    left it uninitialised), for the tests that show who gets blamed."""
    import torch

    import neuron_port.model.loading as models

    real = models.load_model_dir

    def broken(directory, dtype=torch.float32):
        model = real(directory, dtype)
        model.model.embed_tokens.embed_scale.fill_(WRONG_EMBED_SCALE)
        return model

    monkeypatch.setattr(models, "load_model_dir", broken)


def load_rank0_port(directory: Path):
    """Rank 0's port of a verified artifact, assembled as a single-host reader does."""
    from neuron_port.artifacts.manifest import verify
    from neuron_port.artifacts.reader import load_rank_port

    return load_rank_port(directory, verify(directory), 0)


def write_tiny_artifact(model, out_dir: Path, source, buckets=(32,), kv_lens=(64,)):
    """A CPU artifact of ``model`` at tp 1; returns its manifest."""
    from neuron_port.artifacts.writer import write_artifact
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.layout import describe
    from neuron_port.parallel.ranks import RankSetup

    return write_artifact(out_dir, model, source, RankSetup.for_layout(describe(model), 1), PortShape(buckets, kv_lens))


def hub_cache(cache: Path, repo_id: str, source: Path, revision: str = "main", commit: str = "0" * 40) -> Path:
    """A Hugging Face hub cache laid out on disk as ``huggingface_hub`` writes one (no network): under
    ``cache``, ``models--{owner}--{name}/refs/{revision}`` naming ``commit``, and that commit's snapshot holding
    links to ``source``'s files. Point ``HF_HUB_CACHE`` at ``cache``; returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in Path(source).iterdir():
        if f.is_file():
            (snapshot / f.name).symlink_to(f.resolve())
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


STANDIN_SDK = Path(__file__).parent / "support" / "sdk_standin"


def standin_env(**extra: str) -> dict[str, str]:
    """This environment with the stand-in Neuron SDK (``tests/support/sdk_standin``) importable, for a child process."""
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN_SDK), str(Path(__file__).resolve().parents[1])])
    env.update(extra)
    return env


def compile_with_planted_checkpoint(plant: str, *compile_args: str) -> subprocess.CompletedProcess:
    """``neuron-port compile *compile_args`` in a child with the stand-in SDK, whose device checkpoint
    (:func:`neuron_port.backends.nxd_checkpoint.nxd_checkpoint`) is changed by ``plant``: Python over
    ``state``, with ``model`` and ``torch`` in scope."""
    code = ("import sys, torch\n"
            "import neuron_port.backends.nxd_checkpoint as nxd\n"
            "original = nxd.nxd_checkpoint\n"
            "def planted(model, setup, layer_dtype=None):\n"
            "    state = original(model, setup, layer_dtype)\n"
            f"    {plant}\n"
            "    return state\n"
            "nxd.nxd_checkpoint = planted\n"
            "from neuron_port.cli.command import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, "compile", *compile_args], capture_output=True, text=True,
                          env=standin_env(), timeout=600)


STANDIN_SHAPE = ["--buckets", "8,16", "--kv-lens", "32"]
TIGHT = 1e-4
"""A float32 artifact through the same Hugging Face layers: the largest step's logit error over the largest logit."""
"""Two prompt buckets and one KV length: small enough for a stand-in compile in seconds."""


def compile_on_standin(out: Path, name: str, backend: str, *extra: str) -> dict:
    """``neuron-port compile NAME --backend BACKEND`` at :data:`STANDIN_SHAPE` in a child with the stand-in SDK
    (``--tiny`` unless NAME is a config.json); its JSON summary."""
    import json

    tiny = ["--random-weights"] if name.endswith(".json") else ["--tiny"]
    res = run_cli_process("compile", name, *tiny, "--backend", backend, *STANDIN_SHAPE, *extra, "--out", str(out), "--json",
                          env=standin_env())
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def generate_on_standin(artifact: Path, new_tokens: int = 12, prompt_len: int = 10, check: bool = True) -> dict:
    """``neuron-port generate ARTIFACT --json`` (with ``--check`` unless ``check`` is False) in a fresh process
    with the stand-in SDK; its JSON. A failed check (exit 1) still returns what it printed."""
    import json

    res = run_cli_process("generate", str(artifact), "--prompt-len", str(prompt_len), "--max-new-tokens", str(new_tokens),
                          *(["--check"] if check else []), "--json", env=standin_env())
    assert res.returncode in ((0, 1) if check else (0,)), res.stderr[-3000:]
    return json.loads(res.stdout)


def shard_dtypes(artifact: Path, core: int = 0) -> dict[str, str]:
    """Key -> safetensors dtype (``"I8"``, ``"F32"``...) of core ``core``'s shard in an nxd or neuron artifact."""
    from safetensors import safe_open

    with safe_open(str(artifact / "rank0" / "weights" / f"tp{core}_sharded_checkpoint.safetensors"), "pt") as f:
        return {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}


def copy_tree(src: Path, tmp_path: Path) -> Path:
    """A copy of the directory ``src`` under ``tmp_path``, for a test that edits what a shared fixture made."""
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def cli_json(result: CliResult):
    """The JSON a command printed (asserting a zero exit)."""
    import json

    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def straddling_model():
    """A tiny E4B with 6 query and 3 KV heads: at tp 2 each rank's queries straddle a KV group."""
    from neuron_port.families import family_for
    from neuron_port.model.configs import load_config_dict, tiny_config_dict
    from neuron_port.model.loading import build_model

    text = tiny_config_dict(load_config_dict("gemma-4-e4b"))
    text.update(num_attention_heads=6, num_key_value_heads=3)
    return build_model(family_for(text["model_type"]).make_config(text), seed=0)


def record_decode_rows(set_attribute=setattr) -> list[int]:
    """Spy on ``Runners.decode_step``: the returned list gets the rows of every decode step's graph, in order
    (``set_attribute``: ``monkeypatch.setattr`` in a test, plain ``setattr`` in a fresh process)."""
    from neuron_port.graph.runners import Runners

    used: list[int] = []
    chosen = Runners.decode_step

    def spied(self, needed: int, kv: int):
        rows, runner = chosen(self, needed, kv)
        used.append(rows)
        return rows, runner

    set_attribute(Runners, "decode_step", spied)
    return used


def run_slot_schedule(port, schedule, slots: int) -> dict[int, list[int]]:
    """Drive a ``SlotBatch`` of ``slots`` by hand: ``schedule`` = [(arrival step, prompt, params)]; the tokens
    of each request, by its index in ``schedule``."""
    from neuron_port.generation.request_state import TokenEvent
    from neuron_port.generation.slots import SlotBatch

    batch = SlotBatch(port, slots)
    tokens: dict[int, list[int]] = {i: [] for i in range(len(schedule))}
    waiting, step, done = [], 0, set()
    while len(done) < len(schedule):
        waiting += [i for i, (arrive, _, _) in enumerate(schedule) if arrive == step]
        take, waiting = waiting[: len(batch.free)], waiting[len(batch.free):]
        outcomes = batch.admit([(schedule[i][1], schedule[i][2], i) for i in take]) + batch.step()
        for owner, event in outcomes:
            assert isinstance(event, TokenEvent), event
            tokens[owner].append(event.token_id)
            if event.finish_reason is not None:
                done.add(owner)
        step += 1
        assert step < 500
    return tokens


def ranks_match_hf(model, tp: int, in_process: bool, tolerance: float = 1e-4):
    """Generate 48 greedy tokens from a seeded 24-token prompt at ``tp`` (threads, or gloo processes when not
    ``in_process``) and assert tokens equal Hugging Face's and every step's logits are within ``tolerance`` of the
    largest; the result."""
    import torch

    from neuron_port.checks.oracle import reference_generate
    from neuron_port.generation.generate import generate
    from neuron_port.generation.logits import softcap
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.graph.shapes import PortShape

    prompt = torch.randint(3, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(1000)).tolist()
    prompt[0] = 2
    ref = reference_generate(model, prompt, 48, [])
    got = generate(
        model,
        GenerationRequest.greedy([prompt], 48, keep_logits=True),
        shape=PortShape([32], 128),
        tp=tp,
        mode="threads" if in_process else "gloo",
    )
    assert got.tokens[0] == ref.tokens
    port_logits = softcap(torch.stack(got.step_logits)[:, 0], model.config.final_logit_softcapping)
    ref_logits = torch.stack(ref.logits)
    rel = (port_logits - ref_logits).abs().max() / ref_logits.abs().max()
    assert rel < tolerance, f"logits differ by {rel:.2e} relative (bound {tolerance:.0e})"
    return got
