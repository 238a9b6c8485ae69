"""Where a command's model comes from: a Hugging Face id through the hub cache (laid out on disk here, offline),
a local directory, or a config, whose random weights at full size are refused unless asked for."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from tests.helpers import ServerProcess, hub_cache, run_cli, run_cli_process


@pytest.mark.parametrize("command", [["port"], ["compile", "--out", "OUT"], ["serve"]])
def test_a_shipped_name_without_tiny_is_refused_naming_its_real_weights(command, tmp_path):
    args = [a if a != "OUT" else str(tmp_path / "A") for a in command]
    res = run_cli(args[0], "gemma-4-e2b", *args[1:])
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "google/gemma-4-E2B-it" in res.stderr and "--tiny" in res.stderr and "--random-weights" in res.stderr
    assert not (tmp_path / "A").exists()


def test_random_weights_at_full_size_only_when_asked(tmp_path):
    config = tmp_path / "config.json"
    from neuron_port.model.configs import config_to_dict, load_config

    config.write_text(json.dumps(config_to_dict(load_config("llama", tiny=True))))
    refused = run_cli("port", str(config), "--prompt-len", "4", "--max-new-tokens", "2")
    assert refused.returncode == 2 and "is a config, not weights" in refused.stderr
    ran = run_cli("port", str(config), "--random-weights", "--prompt-len", "4", "--max-new-tokens", "2", "--json")
    assert ran.returncode == 0, ran.stderr
    assert len(json.loads(ran.stdout)["tokens"]) == 2


@pytest.mark.slow
def test_a_hub_id_from_the_cache_compiles_and_generates_offline(smollm2_dir, tmp_path):
    """SmolLM2 under its hub id in an on-disk hub cache, downloads off: compile in one process, generate the
    real model's text in another (the id resolved to the cached snapshot, tokenizer included)."""
    cache = tmp_path / "hub"
    snapshot = hub_cache(cache, "HuggingFaceTB/SmolLM2-135M-Instruct", smollm2_dir)
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    res = run_cli_process("compile", "HuggingFaceTB/SmolLM2-135M-Instruct", "--backend", "cpu", "--buckets", "16",
                          "--kv-lens", "64", "--out", str(tmp_path / "A"), "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((tmp_path / "A" / "manifest.json").read_text())
    assert manifest["source"]["path"] == str(snapshot.resolve())
    res = run_cli_process("generate", str(tmp_path / "A"), "--prompt", "The capital of France is", "--max-new-tokens",
                          "4", "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["text"].startswith(" Paris")
    absent = run_cli_process("compile", "HuggingFaceTB/absent", "--out", str(tmp_path / "B"), env=env)
    assert absent.returncode == 2 and "HF_HUB_OFFLINE=1" in absent.stderr and "Traceback" not in absent.stderr
    # served by its id: clients name it as the hub does, not by the snapshot's commit
    srv = ServerProcess("HuggingFaceTB/SmolLM2-135M-Instruct", "--buckets", "16", "--kv-lens", "64", env=env, timeout=300)
    try:
        with urllib.request.urlopen(srv.base + "/v1/models", timeout=10) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    finally:
        assert srv.stop() == 0
    assert "neuron-port: serving HuggingFaceTB/SmolLM2-135M-Instruct on" in srv.output()


def test_the_served_name_is_the_id_as_given_or_the_one_asked_for():
    from argparse import Namespace

    from neuron_port.cli.commands.serving import served_name

    hub = Namespace(served_model_name=None, model_as_given="org/model", model="/cache/snapshots/abc")
    assert served_name(hub) == "org/model"
    assert served_name(Namespace(served_model_name=None, model_as_given="dir", model="dir")) is None
    assert served_name(Namespace(served_model_name="chat", model_as_given="org/model", model="/x")) == "chat"


@pytest.mark.slow
def test_a_text_prompt_streams_its_answer_for_people_and_json_for_scripts(smollm2_dir):
    """Without --json the answer is printed as it is made, then one summary line; --json prints the same text."""
    common = ["port", str(smollm2_dir), "--prompt", "The capital of France is", "--max-new-tokens", "6",
              "--buckets", "16", "--kv-len", "32"]
    people = run_cli(*common)
    scripts = run_cli(*common, "--json")
    assert people.returncode == 0 and scripts.returncode == 0, people.stderr + scripts.stderr
    text = json.loads(scripts.stdout)["text"]
    lines = people.stdout.splitlines()
    assert text.startswith(" Paris") and people.stdout.startswith(text + "\n")
    assert lines[-1].startswith("[6 new tokens after a 5-token prompt, finish length;")
