"""Layer ``parallel``: tensor parallelism over the layout.

The GQA/TP shard plan (``sharding``, pure arithmetic), cutting a model down to one rank's shard
(``shard_model``), the plan made once and carried to every rank (``ranks``), ranks as threads or
gloo processes (``launch``), and a traceable all-reduce (``collectives``).
"""

from __future__ import annotations

from neuron_port.parallel.ranks import Rank, RankSetup, make_rank, run_ranks

__all__ = ["RankSetup", "Rank", "make_rank", "run_ranks"]
