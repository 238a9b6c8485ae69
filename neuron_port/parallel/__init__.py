"""Layer ``parallel``: tensor parallelism over the layout.

The GQA/TP shard plan (``sharding``, pure arithmetic), cutting a model down to one rank's shard
(``shard_model``), the plan made once and carried to every rank (``ranks``), ranks as threads or
gloo processes (``launch``), and a traceable all-reduce (``collectives``).
"""
