"""Stand-in torch_neuronx (see tests/support/sdk_standin/README.md): importable, and nothing else."""

__version__ = "2.8.0+standin"
