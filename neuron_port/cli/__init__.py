"""Layer ``cli``, the top: the ``neuron-port`` command (``command``), its subcommands
(``commands``) and what the recipes in ``examples/`` share (``recipe``)."""
