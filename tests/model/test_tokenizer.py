"""Tokenizer files next to a model: found from the directory or a file in it, and completions decoded
as transformers decodes them (special tokens and a final stop token left out)."""

from neuron_port.model.localdir import write_tokenizer
from neuron_port.model.tokenizer import decode_completion, load_tokenizer


def test_the_tokenizer_is_found_next_to_the_model_or_not_at_all(tmp_path):
    assert load_tokenizer(tmp_path) is None and decode_completion(tmp_path, [5, 6]) is None
    write_tokenizer(tmp_path, 512)
    from_dir, from_file = load_tokenizer(tmp_path), load_tokenizer(tmp_path / "config.json")
    assert from_dir.get_vocab_size() == from_file.get_vocab_size() == 512


def test_a_completion_leaves_out_special_tokens_and_its_final_stop(tmp_path):
    write_tokenizer(tmp_path, 512)
    tok = load_tokenizer(tmp_path)
    words = tok.encode("the user is", add_special_tokens=False).ids
    eos, bos = tok.token_to_id("<eos>"), tok.token_to_id("<bos>")
    text = tok.decode(words)
    assert tok.token_to_id("<unk>") not in words and text == "the user is"
    assert decode_completion(tmp_path, [bos, *words, eos], [eos]) == text
    plain = words[-1]  # a stop id that is an ordinary word is cut only at the end
    assert decode_completion(tmp_path, words, [plain]) == tok.decode(words[:-1])
    assert decode_completion(tmp_path, words + words, [plain]) == tok.decode(words + words[:-1])
