"""The port command: all three Gemma-4 sizes checked, tp 2 over gloo, KV bytes, a prompt over the largest
bucket."""


import json

from neuron_port import describe, load_config
from neuron_port.graph.kv import kv_store_spec, naive_kv_bytes
from tests.helpers import run_cli


def test_kv_bytes_tiny_e2b_owners_only_rings_at_window():
    layout = describe(load_config("gemma-4-e2b", tiny=True))
    kv_len = 256
    spec = kv_store_spec(layout, kv_len)
    expected = 0
    for i in layout.kv_owners:
        s = layout.layers[i]
        slots = s.window if s.attention == "sliding" else kv_len
        expected += 2 * s.n_kv * slots * s.head_dim * 4
    assert spec.total_bytes(1, 4) == expected
    assert set(spec.bytes_per_layer()) == set(layout.kv_owners) == {0, 1, 2, 3, 4, 5}
    assert naive_kv_bytes(layout, kv_len, 1, 4) == sum(2 * s.n_kv * kv_len * s.head_dim * 4 for s in layout.layers)
    res = run_cli("port", "gemma-4-e2b", "--tiny", "--kv-len", "256", "--max-new-tokens", "4", "--json")
    assert json.loads(res.stdout)["kv_cache_bytes"] == expected


def _port_json(*args):
    res = run_cli("port", *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_port_cli_check_all_three_sizes():
    for name in ("gemma-4-e2b", "gemma-4-e4b", "gemma-4-12b"):
        d = _port_json(name, "--tiny", "--check")
        layout = describe(load_config(name, tiny=True))
        assert d["prompt_tokens"] > layout.sliding_window
        assert d["new_tokens"] >= 48
        assert d["seq_match"] is True and d["tokens"] == d["reference_tokens"], d["divergence"]
        assert d["kv_cache_bytes"] < d["kv_cache_bytes_naive"]
        for key in ("model", "backend", "tp", "prefill_s", "decode_tok_per_s"):
            assert key in d


def test_port_cli_tp2_gloo():
    """The command at tp 2 (gloo ranks); the 12B's ranks are compared logit by logit in test_tp_execution."""
    d = _port_json("gemma-4-e4b", "--tiny", "--tp", "2", "--check")
    assert d["tp"] == 2 and d["seq_match"] is True and d["new_tokens"] >= 48


def test_prompt_over_largest_bucket_is_a_clear_error():
    res = run_cli("port", "gemma-4-e2b", "--tiny", "--prompt-len", "200", "--buckets", "32,64", "--json")
    assert res.returncode != 0
    assert "200 tokens" in res.stderr and "largest prompt bucket (64)" in res.stderr
    assert res.stdout == ""


def test_port_speculates_on_all_three_sizes_and_keeps_hugging_faces_tokens():
    """``--speculate ngram`` against transformers' greedy generate on the same random weights (E2B also at tp 2)."""
    from neuron_port.checks.oracle import reference_generate
    from neuron_port.generation.prompts import random_prompt
    from neuron_port.model.loading import build_model

    kept = 0
    for name, tp in (("gemma-4-e2b", 1), ("gemma-4-e2b", 2), ("gemma-4-e4b", 1), ("gemma-4-12b", 1)):
        d = _port_json(name, "--tiny", "--speculate", "ngram", "--draft-tokens", "3", "--tp", str(tp))
        config = load_config(name, tiny=True)
        prompt = random_prompt(config.vocab_size, 24, 0, config.bos_token_id)
        assert d["tokens"] == reference_generate(build_model(config, seed=0), prompt, 48).tokens, name
        spec = d["speculation"]
        assert spec["drafted"] > 0 and spec["verify_steps"] + spec["accepted"] == 47, (name, spec)  # 48 - the prefill's
        kept += spec["accepted"]
    assert kept > 0  # drafts were kept somewhere: the check is not only of verify steps that keep nothing


def test_what_speculation_cannot_do_yet_is_said_before_any_model_is_built():
    for extra, said in ((["--check"], "verify steps do not keep"), (["--draft-tokens", "0"], "1 or more"),
                        (["--backend", "neuron"], "cpu backend or through torch-xla"),
                        (["--backend", "xla", "--speculate", "assistant"], "ngram only: the drafter runs eagerly")):
        res = run_cli("port", "gemma-4-e2b", "--tiny", "--speculate", "ngram", *extra, "--json")
        assert res.returncode != 0 and said in res.stderr and res.stdout == "", res.stderr


def test_port_speculates_with_a_gemma4_drafter_from_its_directory(tmp_path):
    """``--speculate assistant --draft DIR``: the drafter transformers saved, read by the port over its own store; the
    tokens are transformers' greedy tokens (its drafts and acceptance against ``generate(assistant_model=)``:
    tests/generation/test_drafting.py)."""
    from neuron_port.checks.oracle import reference_generate
    from neuron_port.generation.prompts import random_prompt
    from neuron_port.model.drafter import build_drafter
    from neuron_port.model.loading import build_model

    config = load_config("gemma-4-e2b", tiny=True)
    build_drafter(config, seed=5).save_pretrained(tmp_path / "drafter")
    d = _port_json("gemma-4-e2b", "--tiny", "--max-new-tokens", "16", "--speculate", "assistant", "--draft",
                   str(tmp_path / "drafter"), "--draft-tokens", "3")
    prompt = random_prompt(config.vocab_size, 24, 0, config.bos_token_id)
    assert d["tokens"] == reference_generate(build_model(config, seed=0), prompt, 16).tokens
    spec = d["speculation"]
    assert spec["method"] == "assistant" and spec["drafter"] == str(tmp_path / "drafter")
    assert spec["drafted"] > 0 and spec["verify_steps"] + spec["accepted"] == 15, spec


def test_what_a_drafter_cannot_do_is_said_in_one_line():
    for args, said in ((["gemma-4-e2b", "--random-weights", "--speculate", "assistant"], "--draft DIR"),
                       (["gemma-4-e2b", "--tiny", "--speculate", "assistant", "--tp", "2"], "--tp 1"),
                       (["gemma-4-e2b", "--tiny", "--speculate", "ngram", "--draft", "x"], "--speculate assistant"),
                       (["llama", "--tiny", "--speculate", "assistant"], "no Gemma-4 drafter")):
        res = run_cli("port", *args, "--json")
        assert res.returncode == 2 and said in res.stderr and res.stdout == "", res.stderr
        assert "Traceback" not in res.stderr
