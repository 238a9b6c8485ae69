"""Stand-in neuronx_distributed (see tests/support/sdk_standin/README.md)."""

__version__ = "0.15.0+standin"
