"""Layer ``checks``: is the port right?

The oracle is transformers' own ``from_pretrained`` (``reference``); the library's loader is
compared with it tensor by tensor (``loader_check``); greedy runs against Hugging Face
(``oracle``); self-checks for what tokens cannot show (``selfcheck``); fresh-process validation of
an artifact; ``doctor``; static and XLA lint.
"""
