"""What one core holds: the counted device parameters equal the parameters a rank's real shard has
(embedding tables aside, the tied LM head once), at tp 1 and where KV heads are replicated."""

import pytest

from neuron_port.model.layout import describe
from neuron_port.parallel.per_core import core_params, device_params_per_core, rank0_kv_heads
from neuron_port.parallel.ranks import RankSetup
from neuron_port.parallel.shard_model import shard_model


def _shard_device_params(model, setup, rank: int) -> int:
    """Parameters of rank ``rank``'s shard the device reads: every unique one but the per-layer table
    (the word table is the tied LM head, which the device does read)."""
    shard = model if setup.tp == 1 else shard_model(model, setup.layout, setup.plan, rank)
    family = setup.layout.family
    ple = family.per_layer_embedding(shard)
    host = {id(ple.weight)} if ple is not None else set()
    unique = {id(p): p for p in family.text_model(shard).parameters()}
    return sum(p.numel() for key, p in unique.items() if key not in host)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_count_is_what_a_rank_shard_holds(tiny_e2b, tp):
    layout = describe(tiny_e2b)
    setup = RankSetup.for_layout(layout, tp)
    assert device_params_per_core(layout, tiny_e2b.config, tp) == _shard_device_params(tiny_e2b, setup, 0)


def test_kv_heads_per_rank_are_replicated_below_the_degree(tiny_e2b):
    layout = describe(tiny_e2b)
    assert rank0_kv_heads(layout, 1) is None
    heads = rank0_kv_heads(layout, 4)
    for spec in layout.layers:  # fewer KV heads than ranks: each rank holds one, replicated
        assert heads[spec.index] == max(1, spec.n_kv // 4)


@pytest.mark.parametrize("name,tp", [("gemma-4-e2b", 1), ("gemma-4-e2b", 2), ("gemma-4-12b", 2), ("gemma-4-e4b", 4)])
def test_projections_and_their_output_channels_are_what_a_rank_shard_holds(name, tp):
    """The split --quant int8 needs: projection elements (one byte each) and output channels (one
    fp32 scale each), counted from the layout, equal rank 0's real shard."""
    from neuron_port.model.configs import load_config
    from neuron_port.model.loading import build_model

    model = build_model(load_config(name, tiny=True))
    layout = describe(model)
    setup = RankSetup.for_layout(layout, tp)
    shard = model if tp == 1 else shard_model(model, layout, setup.plan, 0)
    family = layout.family
    elements = rows = 0
    for spec, layer in zip(layout.layers, family.decoder_layers(shard), strict=True):
        attention, mlp = family.layer_projections(layer, spec.index)
        for part in [*attention.values(), *mlp.values()]:
            if part is not None:
                elements += part.weight.numel()
                rows += part.weight.shape[0]
    counted = core_params(layout, model.config, tp)
    assert (counted.projections, counted.projection_rows) == (elements, rows)
    assert counted.total == device_params_per_core(layout, model.config, tp)
    bf16, int8 = counted.weight_bytes(2), counted.weight_bytes(2, "int8")
    head = layout.vocab_size * layout.hidden_size  # replicated on every core
    assert (counted.head, counted.head_rows) == (head, layout.vocab_size)
    assert int8 == elements + 4 * rows + 2 * (head + counted.other) and bf16 == 2 * counted.total
    # --quant-head: the head at one byte plus a scale per vocab row
    assert counted.weight_bytes(2, "int8+head") == int8 - 2 * head + head + 4 * layout.vocab_size
    on_device = core_params(layout, model.config, tp, embeddings_on_device=True)
    # a word table on the device is the float head's memory; an int8 head unties them, so the table counts too
    assert on_device.weight_bytes(2) - bf16 == 2 * layout.params.per_layer_embedding
    assert on_device.weight_bytes(2, "int8+head") - counted.weight_bytes(2, "int8+head") == 2 * (
        layout.params.per_layer_embedding + head)
    with pytest.raises(ValueError, match="quant must be one of"):
        counted.weight_bytes(2, "int4")


def test_a_word_table_on_the_device_is_counted_once_when_tied_and_beside_the_head_when_not():
    from neuron_port.model.configs import load_config

    for name, tied in (("gemma-4-e2b", True), ("mistral", False)):
        config = load_config(name, tiny=True)
        layout = describe(config)
        assert layout.family.tied_embeddings(config) is tied
        host, device = core_params(layout, config, 1), core_params(layout, config, 1, embeddings_on_device=True)
        head = layout.vocab_size * layout.hidden_size
        assert device.total - host.total == layout.params.per_layer_embedding + (0 if tied else head)
