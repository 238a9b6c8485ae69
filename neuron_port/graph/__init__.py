"""Layer ``graph``: one rank's static prefill and decode graphs.

The owners-only KV store (``kv``), the masks and maps the graphs build (``masks``), host
embeddings, the static attention function, prompt buckets and KV lengths (``shapes``), the inputs
of one step (``step``, ``host_inputs``, ``scratch``), the graphs over Hugging Face's forward
(``graphs``), the compile loop with save and load (``runners``), and
:class:`~neuron_port.graph.port.Port`, one rank's port.
"""
