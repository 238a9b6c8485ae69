"""Shared test helpers."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


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
    """``neuron-port serve ARGS`` on a free 127.0.0.1 port, started and stopped by the test."""

    def __init__(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None):
        import socket
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neuron_port", "serve", *args, "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.proc.stdout.read()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not become healthy in time")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
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


def write_tiny_artifact(model, out_dir: Path, source: dict, buckets=(32,), kv_lens=(64,)) -> dict:
    """A CPU artifact of ``model`` at tp 1; returns its manifest."""
    from neuron_port.artifacts.writer import write_artifact
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.layout import describe
    from neuron_port.parallel.ranks import RankSetup

    return write_artifact(out_dir, model, source, RankSetup.for_layout(describe(model), 1), PortShape(buckets, kv_lens))


STANDIN_SDK = Path(__file__).parent / "sdk_standin"


def standin_env(**extra: str) -> dict[str, str]:
    """This environment with the stand-in Neuron SDK (``tests/sdk_standin``) importable, for a child process."""
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN_SDK), str(Path(__file__).resolve().parents[1])])
    env.update(extra)
    return env
