"""The ``neuron-port`` console script: the command, or one line when the package cannot import.

It lives outside the package so that a refused environment (say, transformers older than the
library needs) is reported as ``error: ...`` and exit status 2, not as a traceback.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from neuron_port.cli.command import main as command
    except ImportError as exc:
        if not getattr(exc, "neuron_port_refusal", False):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return command()


if __name__ == "__main__":
    sys.exit(main())
