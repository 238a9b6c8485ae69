"""Chat formats from the model's own files, BOS, stop tokens, and prompts as the tokenizer encodes them."""


from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402

from neuron_port.families import family_for  # noqa: E402
from neuron_port.families.gemma4 import gemma_chat_prompt  # noqa: E402
from neuron_port.generation.chat import chat_format  # noqa: E402
from neuron_port.generation.prompts import bos_prefix, text_prompt  # noqa: E402
from neuron_port.model.localdir import build_tokenizer  # noqa: E402

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def test_the_family_default_applies_without_tokenizer_files():
    tok = build_tokenizer(512)
    fmt = chat_format(family_for("gemma4_text"), tok, None)
    assert fmt.render(MESSAGES) == "<start_of_turn>user\nbe brief\n\nhello<end_of_turn>\n<start_of_turn>model\n"
    assert fmt.render(MESSAGES) == gemma_chat_prompt(MESSAGES)
    assert fmt.stop_ids == (tok.token_to_id("<end_of_turn>"),)
    llama = chat_format(family_for("llama"), tok, None)
    assert llama.render(MESSAGES[1:]).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert llama.stop_ids == ()  # the demo tokenizer has no <|eot_id|>: nothing to stop on, nothing invented
    assert "<|im_start|>assistant\n" in chat_format(family_for("qwen3"), tok, None).render(MESSAGES)


def test_the_tokenizer_config_template_and_eos_win(tmp_path):
    tok = build_tokenizer(512)
    template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}[model]{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": {"content": "<eos>"}}))
    fmt = chat_format(family_for("gemma4_text"), tok, tmp_path)
    assert fmt.render(MESSAGES) == "[system] be brief [user] hello [model]"
    assert fmt.stop_ids == (tok.token_to_id("<eos>"), tok.token_to_id("<end_of_turn>"))


def test_a_family_without_a_format_and_no_template_is_a_clear_error():
    class Plain(type(family_for("llama"))):
        def chat_prompt(self, messages):
            return None

    with pytest.raises(ValueError, match="no chat template"):
        chat_format(Plain(), build_tokenizer(512), None).render(MESSAGES)


def test_bos_is_prepended_only_when_the_tokenizer_does_not_add_it():
    bare = Tokenizer(models.WordLevel({"<bos>": 0, "a": 1, "<unk>": 2}, unk_token="<unk>"))
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    assert bos_prefix(bare, 0) == [0] and bos_prefix(bare, None) == []
    adds = Tokenizer(models.WordLevel({"<bos>": 0, "a": 1, "<unk>": 2}, unk_token="<unk>"))
    adds.pre_tokenizer = pre_tokenizers.Whitespace()
    adds.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    assert adds.encode("a").ids == [0, 1]
    assert bos_prefix(adds, 0) == []
    assert bos_prefix(build_tokenizer(512), 2) == []  # the demo tokenizer puts <bos> first itself, like Gemma's


def test_a_text_prompt_is_the_tokenizers_own_encoding(tmp_path):
    """As transformers' tokenizer of the same files: BOS when the tokenizer adds it, never a second one,
    none when it adds none (SmolLM2's does not)."""
    from transformers import AutoTokenizer

    adds = Tokenizer(models.WordLevel({"<bos>": 0, "a": 1, "<unk>": 2}, unk_token="<unk>"))
    adds.pre_tokenizer = pre_tokenizers.Whitespace()
    adds.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    adds.save(str(tmp_path / "tokenizer.json"))
    assert text_prompt(tmp_path, "a a") == [0, 1, 1] == AutoTokenizer.from_pretrained(str(tmp_path))("a a").input_ids
    bare = Tokenizer(models.WordLevel({"<bos>": 0, "a": 1, "<unk>": 2}, unk_token="<unk>"))
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    bare.save(str(tmp_path / "tokenizer.json"))
    assert text_prompt(tmp_path, "a a") == [1, 1] == AutoTokenizer.from_pretrained(str(tmp_path))("a a").input_ids
    build_tokenizer(512).save(str(tmp_path / "tokenizer.json"))
    assert text_prompt(tmp_path, "hello")[0] == 2 and len(text_prompt(tmp_path, "hello")) == 2


def test_a_chat_template_renders_as_transformers_renders_it(tmp_path):
    """Loop controls, the generation tag, tojson's options, tools/documents as none, the special
    tokens as variables: the same text as transformers' apply_chat_template, and the same ids."""
    from transformers import AutoTokenizer

    from neuron_port.generation.chat import chat_format
    from neuron_port.model.localdir import write_tokenizer

    write_tokenizer(tmp_path, 512)
    template = (
        "{{ bos_token }}{% if tools is not none %}TOOLS{% endif %}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "<start_of_turn>{{ m['role'] }} {{ m['content'] | tojson(ensure_ascii=True) }}<end_of_turn>\n"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    (tmp_path / "chat_template.jinja").write_text(template)
    messages = [
        {"role": "system", "content": "skip me"},
        {"role": "user", "content": "hello wörld"},
        {"role": "assistant", "content": "paris"},
        {"role": "user", "content": "water"},
    ]
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    fmt = chat_format(family_for("gemma3_text"), build_tokenizer(512), tmp_path)
    assert fmt.render(messages) == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert fmt.encode(messages, build_tokenizer(512), 2) == list(
        hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('only user turns, found ' + messages[0]['role']) }}")
    with pytest.raises(ValueError, match="only user turns, found system"):
        chat_format(family_for("gemma3_text"), build_tokenizer(512), tmp_path).render(messages)
