"""Host embeddings: the gathers equal the model's own (scaled) embedding modules, and the slim loader
reads the same tables from a directory as the model holds."""

import torch

from neuron_port.graph.embedding import HostEmbeddings, load_host_embeddings

IDS = torch.tensor([[2, 17, 300, 511], [5, 0, 44, 9]])


def test_host_gathers_equal_the_models_embedding_modules(tiny_e2b):
    host = HostEmbeddings.from_model(tiny_e2b)
    words, per_layer = host.embed(IDS)
    text = tiny_e2b.model
    with torch.no_grad():
        assert torch.equal(words, text.embed_tokens(IDS))  # the scaled word embedding Hugging Face applies
        want = text.embed_tokens_per_layer(IDS).reshape(*IDS.shape, host.num_layers, host.per_layer)
    assert torch.equal(per_layer, want)
    assert host.nbytes() == (host.word.numel() + host.ple.numel()) * 4


def test_the_slim_loader_reads_the_tables_the_model_holds(tiny_e2b, tmp_path):
    tiny_e2b.save_pretrained(str(tmp_path))
    slim = load_host_embeddings(tmp_path, tiny_e2b.config)
    full = HostEmbeddings.from_model(tiny_e2b)
    assert torch.equal(slim.word, full.word) and torch.equal(slim.ple, full.ple)
    assert [torch.equal(a, b) for a, b in zip(slim.embed(IDS), full.embed(IDS), strict=True)] == [True, True]
