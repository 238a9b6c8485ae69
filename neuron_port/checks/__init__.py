"""Layer ``checks``: is the port right?

The oracle is transformers' own ``from_pretrained`` (``reference``); the library's loader is
compared with it tensor by tensor (``loader_check``); greedy runs against Hugging Face
(``oracle``); self-checks for what tokens cannot show (``selfcheck``); a checked run's record
(``checked_run``); fresh-process validation of an artifact; ``doctor``; static and XLA lint.
"""

from __future__ import annotations

from neuron_port.checks.check import Check
from neuron_port.checks.checked_run import CheckedRun
from neuron_port.checks.doctor import run_doctor
from neuron_port.checks.oracle import reference_generate
from neuron_port.checks.validation import check_artifact, check_in_fresh_process

__all__ = ["Check", "CheckedRun", "run_doctor", "reference_generate", "check_artifact", "check_in_fresh_process"]
