"""Small local model directories for tests and demos (no hub is reachable).

``write_model_dir`` writes ``config.json`` and ``model.safetensors`` of a text CausalLM (buffers
included), plus a word-level tokenizer built with the ``tokenizers`` library whose vocabulary
matches the model's: ids 0-5 are ``<pad>``, ``<eos>``, ``<bos>``, ``<unk>`` (Gemma's pad 0,
eos 1, bos 2), ``<start_of_turn>``, ``<end_of_turn>`` (for the chat template); the rest are words. Like Gemma's, the
tokenizer puts BOS first itself (its post-processor), as transformers' own tokenizer of the files does.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from torch import nn

from neuron_port.model.loading import save_model_dir

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
_WORDS = (
    "user model system the of and to in is was for on that with as by at from it his an were are which this be or "
    "has had not but first one their its new after who they have her she two been other when there "
    "all during into school time may years more most only over city some world would where later up "
    "such used many can state about national out known university united then made hello world paris "
    "france capital river north south east west king queen day night water fire earth light music"
).split()


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """A word-level tokenizer with exactly ``vocab_size`` entries."""
    words = list(dict.fromkeys(_WORDS))
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    i = len(vocab)
    for w in words:
        if i >= vocab_size:
            break
        vocab[w] = i
        i += 1
    while i < vocab_size:
        vocab[f"w{i}"] = i
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(SPECIALS)
    # Like Gemma's tokenizer.json: the post-processor puts <bos> first, so transformers' tokenizer
    # and this one agree on every prompt's ids.
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", SPECIALS.index("<bos>"))])
    return tok


def write_tokenizer(out_dir: str | Path, vocab_size: int) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(vocab_size).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                    "add_bos_token": True}, indent=2)
    )
    return out / "tokenizer.json"


def write_model_dir(model: nn.Module, out_dir: str | Path, tokenizer: bool = True) -> Path:
    """A complete local model directory: config.json, model.safetensors, tokenizer files."""
    out = save_model_dir(model, out_dir)
    if tokenizer:
        from neuron_port.model.layout import describe

        write_tokenizer(out, describe(model).vocab_size)
    return out


__all__ = ["SPECIALS", "build_tokenizer", "write_tokenizer", "write_model_dir"]
