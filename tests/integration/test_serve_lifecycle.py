"""``neuron-port serve`` as uvicorn and vLLM behave: it says where it serves what, logs each request, leaves
cleanly on Ctrl-C (a drain, exit 0, no traceback), and stops within seconds, in one error line, when its
model cannot load (rather than answering 503 for ever)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

from tests.helpers import ServerProcess


def _complete(base: str) -> dict:
    body = json.dumps({"model": "gemma-4-e2b", "prompt": [2, 10, 11], "max_tokens": 2}).encode()
    request = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def test_start_line_access_log_and_a_clean_ctrl_c():
    srv = ServerProcess("gemma-4-e2b", "--tiny", "--max-batch", "1", "--buckets", "16", "--kv-lens", "64")
    try:
        assert len(_complete(srv.base)["choices"][0]["text"]) >= 0
    finally:
        code = srv.stop(signal.SIGINT)
    out = srv.output()
    assert code == 0, out
    assert "neuron-port: loading gemma-4-e2b" in out
    assert f"neuron-port: serving gemma-4-e2b on http://127.0.0.1:{srv.port}" in out and "1 slots" in out
    assert '"POST /v1/completions HTTP/1.1" 200' in out  # the access log
    assert "draining (SIGINT)" in out and "Traceback" not in out and "KeyboardInterrupt" not in out


def test_log_level_warning_drops_the_access_log():
    srv = ServerProcess("gemma-4-e2b", "--tiny", "--max-batch", "1", "--buckets", "16", "--kv-lens", "64",
                        "--log-level", "warning")
    try:
        _complete(srv.base)
    finally:
        code = srv.stop()
    assert code == 0 and "POST /v1/completions" not in srv.output() and "neuron-port: serving" not in srv.output()


def test_a_model_that_cannot_load_stops_the_server_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-family"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "neuron_port", "serve", str(tmp_path), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert time.monotonic() - started < 60
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: could not load {tmp_path}:"), res.stderr
    assert "no-such-family" in errors[0] and "Traceback" not in res.stderr
