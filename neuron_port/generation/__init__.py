"""Layer ``generation``: turning a port's logits into text.

Host softcap and greedy pick (``logits``), sampling, prompts and chat formats, one request's
decoding state (``request_state``), the static-batch loop (``static_batch``), continuous batching
over slots (``slots``) and the one ``generate`` for a model, a port or an artifact (``generate``).
It sits above ``artifacts`` because ``generate`` reads them.
"""
