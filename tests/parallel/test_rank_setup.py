"""Every rank carries the one setup and its own shard, across processes."""


from __future__ import annotations

from neuron_port import describe
from neuron_port.families import family_for
from neuron_port.parallel.ranks import RankSetup, run_ranks
from tests.helpers import straddling_model


# ---- ranks -----------------------------------------------------------------------------------
def test_every_rank_carries_the_one_setup_and_its_shard():
    model = straddling_model()
    setup = RankSetup.for_layout(describe(model), 2)
    seen = run_ranks(
        lambda rank: (rank.rank, rank.setup is setup, rank.local_kv_heads, sorted(rank.kv_expand)), setup, model, mode="threads"
    )
    assert [s[0] for s in seen] == [0, 1] and all(s[1] for s in seen)
    for rank, _, kv_heads, expanded in seen:
        assert kv_heads == setup.plan.local_kv_heads(rank)
        assert expanded == list(range(setup.layout.num_layers))  # every layer straddles: 3 q over 2 kv groups
    # the model itself is never sharded
    assert (
        family_for("gemma4_text")
        .attention_projections(family_for("gemma4_text").attention(family_for("gemma4_text").decoder_layers(model)[0]))["q"]
        .out_features
        == 6 * 16
    )
