"""``python -m neuron_port`` runs the ``neuron-port`` command."""

import sys

from neuron_port.cli.command import main

sys.exit(main())
