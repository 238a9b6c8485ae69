"""The transformers version gate: an older release is refused in one line."""


from __future__ import annotations

import os
import subprocess
import sys

from neuron_port.versions import transformers_problem


# ---- the transformers version gate -------------------------------------------------------------
def test_an_old_transformers_is_refused_in_one_line(tmp_path):
    """A transformers 5.23 distribution first on the path: import and command refuse it in one line."""
    info = tmp_path / "transformers-5.23.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.23.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "import neuron_port"], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "ImportError: neuron_port needs transformers >= 5.24" in proc.stderr
    assert "found 5.23.0" in proc.stderr and "AttributeError" not in proc.stderr
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, neuron_port_launcher; sys.exit(neuron_port_launcher.main())",
            "describe",
            "gemma-4-e2b",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: neuron_port needs transformers >= 5.24") and "found 5.23.0" in proc.stderr
    assert transformers_problem("5.24.0") is None and transformers_problem("5.13.0") and transformers_problem(None)
