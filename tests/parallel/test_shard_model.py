"""A rank's shard of a model: column-split gate and up, row-split down, so the ranks' MLP outputs sum
to the unsharded MLP's; the unsharded model is left as it was."""

import pytest
import torch

from neuron_port.model.layout import describe
from neuron_port.parallel.ranks import RankSetup
from neuron_port.parallel.shard_model import RowParallelLinear, shard_model


@pytest.mark.parametrize("tp", [2, 4])
def test_the_ranks_mlp_outputs_sum_to_the_unsharded_mlp(tiny_e2b, tp):
    setup = RankSetup.for_layout(describe(tiny_e2b), tp)
    family = setup.layout.family
    shards = [shard_model(tiny_e2b, setup.layout, setup.plan, rank) for rank in range(tp)]
    x = torch.randn(2, 3, tiny_e2b.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for index, layer in enumerate(family.decoder_layers(tiny_e2b)):
            want = family.mlp(layer)(x)
            parts = [family.mlp(family.decoder_layers(shard)[index]) for shard in shards]
            assert all(isinstance(part.down_proj, RowParallelLinear) for part in parts)
            assert all(part.gate_proj.out_features * tp == family.mlp(layer).gate_proj.out_features for part in parts)
            got = sum(part(x) for part in parts)  # the identity reduce: each rank's partial sum
            assert (got - want).abs().max() < 1e-5 * want.abs().max()
    assert type(family.mlp(family.decoder_layers(tiny_e2b)[0]).down_proj) is torch.nn.Linear  # not edited in place
