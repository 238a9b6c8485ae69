"""The installed neuron-port console script runs."""


import json
import shutil
import subprocess


def test_console_script_installed():
    """The installed ``neuron-port`` entry point runs in a fresh process."""
    exe = shutil.which("neuron-port")
    assert exe, "the neuron-port console script is not on PATH"
    proc = subprocess.run([exe, "describe", "gemma-4-e2b", "--tiny", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kv_owners"] == [0, 1, 2, 3, 4, 5]
