"""Layer ``generation``: turning a port's logits into text.

Host softcap and greedy pick (``logits``), sampling, prompts and chat formats, the one request
and result types (``request``), one row's decoding state (``request_state``), the two schedulers
(the static batch, ``static_batch``; continuous batching over slots, ``slots``) and the one
``generate(source, request)`` for a model, a port or an artifact (``generate``).
It sits above ``artifacts`` because ``generate`` reads them.
"""
