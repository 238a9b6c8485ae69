"""The verify graph (speculative decoding) against Hugging Face's forward: every row of every verify step, over many
steps that accept some drafted tokens and reject the rest, across the sliding rings' wrap. A ring of the window alone
(what plain decode uses) fails the same check."""

from __future__ import annotations

import random

import pytest
import torch

from neuron_port.checks.oracle import teacher_forced_logits
from neuron_port.families import family_of
from neuron_port.generation.logits import softcap
from neuron_port.graph.embedding import HostEmbeddings
from neuron_port.graph.graphs import PrefillGraph, VerifyGraph
from neuron_port.graph.kv import KVStore, KVWrite, kv_store_spec
from neuron_port.graph.step import StepInputs, run_step
from neuron_port.model.configs import load_config
from neuron_port.model.layout import describe
from neuron_port.model.loading import build_model

K, KV_LEN, BUCKET, TOL = 3, 64, 16, 1e-4


@torch.no_grad()
def _worst_error(name: str, draft_tokens: int, seed: int, kv_write: KVWrite = KVWrite.BLEND) -> float:
    """Prefill a prompt, then verify steps of 1..K+1 random tokens, each keeping a random prefix; the largest
    relative error of any verify row's logits (after the softcap) against Hugging Face's teacher-forced forward.
    ``kv_write``: how the verify graphs write their rows."""
    # the graphs get their own instance (and config: they switch its attention function)
    reference, model = (build_model(load_config(name, tiny=True), seed=0) for _ in range(2))
    family, layout = family_of(model), describe(model)
    spec = kv_store_spec(layout, KV_LEN, draft_tokens=draft_tokens)
    embeddings = HostEmbeddings.from_model(model)
    cap = family.softcap(family.text_config_of(model))
    rng = random.Random(seed)
    vocab = layout.vocab_size
    sequence = [rng.randrange(3, vocab) for _ in range(10)]
    ids = torch.tensor([sequence + [0] * (BUCKET - len(sequence))])
    embeds, per_layer = embeddings.embed(ids)
    inputs = StepInputs(embeds, per_layer, torch.arange(BUCKET)[None, :], torch.tensor([len(sequence)]))
    _, store = run_step(PrefillGraph(model, spec, BUCKET), inputs, KVStore.zeros(spec, 1))
    graphs = {s: VerifyGraph(model, spec, s) for s in range(1, K + 2)}
    for graph in graphs.values():
        graph.kv_write = kv_write
    worst = 0.0
    while len(sequence) + K + 1 < KV_LEN - 8:
        tokens = [rng.randrange(3, vocab) for _ in range(rng.randint(1, K + 1))]
        embeds, per_layer = embeddings.embed(torch.tensor([tokens]))
        positions = len(sequence) + torch.arange(len(tokens))[None, :]
        logits, store = run_step(graphs[len(tokens)], StepInputs(embeds, per_layer, positions, positions[:, -1] + 1), store)
        want = teacher_forced_logits(reference, sequence + tokens)[len(sequence):].double()
        got = softcap(logits[0].double(), cap)
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        sequence += tokens[: rng.randint(1, len(tokens))]  # the fed token and some drafted ones kept
    return worst


@pytest.mark.parametrize("name", ["gemma-4-e2b", "mistral"])
def test_every_verify_row_equals_hugging_face(name):
    for seed in range(2):
        assert _worst_error(name, K, seed) < TOL


def test_a_ring_of_the_window_alone_reads_rows_it_must_not(monkeypatch):
    import neuron_port.graph.masks as masks

    with pytest.raises(ValueError, match="needs rings of at least window"):
        _worst_error("gemma-4-e2b", 0, 0)
    monkeypatch.setattr(masks, "check_verify_ring", lambda *a: None)
    assert max(_worst_error("gemma-4-e2b", 0, seed) for seed in range(2)) > 100 * TOL


@pytest.mark.parametrize("kv_write", [KVWrite.ROWS, KVWrite.IN_PLACE])
def test_a_verify_graph_writing_its_rows_by_scatter_equals_hugging_face(kv_write):
    """The writes compiled graphs make (xla's rows returned, cpu TorchScript's in place), across the rings' wrap."""
    assert _worst_error("gemma-4-e2b", K, 0, kv_write) < TOL


@torch.no_grad()
def test_a_port_built_for_drafts_verifies_over_its_store(tiny_e2b):
    from neuron_port.graph.port import Port
    from neuron_port.graph.shapes import PortShape

    reference = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    port = Port.over_model(tiny_e2b, PortShape([16], [32, 64], draft_tokens=K))
    assert sorted(port.runners.verify) == [2, 3, 4] and port.stores.largest.ring == 8 + K
    assert port.stores.shape.to_json()["draft_tokens"] == K and "draft_tokens" not in PortShape([16], [64]).to_json()
    prompt = [2, *range(20, 31)]
    ids = torch.tensor([prompt + [0] * (16 - len(prompt))])
    _, store = run_step(port.runners.prefill[16], port.inputs.prefill(ids, torch.tensor([len(prompt)]), 16),
                        port.inputs.new_store(1, 64))
    tokens = [40, 41, 42, 43]
    logits, _ = run_step(port.runners.verify[4], port.inputs.verify(torch.tensor([tokens]), torch.tensor([len(prompt)])),
                         store)
    want = teacher_forced_logits(reference, prompt + tokens)[len(prompt):].double()
    got = softcap(logits[0].double(), port.layout.softcap)
    assert float((got - want).abs().max() / want.abs().max()) < TOL


def test_verify_graphs_over_one_store_write_rows_and_compiled_ones_are_saved_with_the_rest(tiny_e2b, tmp_path):
    from neuron_port.backends import get_backend
    from neuron_port.graph.port import Port
    from neuron_port.graph.runners import save_runners
    from neuron_port.graph.shapes import PortShape

    one = Port.over_model(tiny_e2b, PortShape([16], [64], draft_tokens=2), one_store=True)
    assert sorted(one.graphs.verify) == [2, 3]
    assert all(g.kind == "verify" and g.kv_write is KVWrite.ROWS for g in one.graphs.verify.values())
    port = Port.over_model(tiny_e2b, PortShape([16], [64], draft_tokens=2))
    backend = get_backend("cpu")
    port.compile(backend)
    assert sorted(port.runners.verify) == [2, 3] and port.runners.facts()["verify"] == [2, 3]
    save_runners(port.runners, backend, tmp_path / "rank0")
    assert {p.name for p in (tmp_path / "rank0").glob("verify_*.pt")} == {"verify_2.pt", "verify_3.pt"}
