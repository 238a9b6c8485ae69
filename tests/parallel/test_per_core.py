"""What one core holds: the counted device parameters equal the parameters a rank's real shard has
(embedding tables aside, the tied LM head once), at tp 1 and where KV heads are replicated."""

import pytest

from neuron_port.model.layout import describe
from neuron_port.parallel.per_core import device_params_per_core, rank0_kv_heads
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
