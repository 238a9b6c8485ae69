"""The values every family adapter shares: a fused projection's role views read the right rows, and
the tiny variants' special ids are the demo tokenizer's."""

import torch

from neuron_port.families import family_for
from neuron_port.families.parts import ATTENTION_ROLES, MLP_ROLES, TINY_SPECIAL_IDS, TINY_VOCAB, RoleConcat, RoleView, SpecialIds
from neuron_port.model.configs import load_config
from neuron_port.model.loading import build_model


def test_a_role_view_reads_its_rows_of_a_fused_weight():
    fused = torch.arange(6 * 4, dtype=torch.float32).view(6, 4)  # q rows 0-1, k rows 2-3, v rows 4-5
    k = RoleView(fused[2:4], bias=torch.ones(2))
    assert (k.out_features, k.in_features) == (2, 4) and torch.equal(k.weight[0], fused[2])
    assert k.weight.data_ptr() == fused[2].data_ptr()  # a view, not a copy
    assert ATTENTION_ROLES == ("q", "k", "v", "o") and MLP_ROLES == ("gate", "up", "down")


def test_a_role_concat_computes_the_fused_projection_from_one_layer_per_role():
    """What a fused module computes, from the layers of its roles (rows in the fused order); a plain fused
    Linear of the same rows is the reference, and the roles in another order are not."""
    torch.manual_seed(0)
    fused = torch.nn.Linear(4, 6)
    roles = {}
    for role, (a, z) in {"q": (0, 2), "k": (2, 4), "v": (4, 6)}.items():
        roles[role] = torch.nn.Linear(4, z - a)
        roles[role].weight.data.copy_(fused.weight[a:z])
        roles[role].bias.data.copy_(fused.bias[a:z])
    x = torch.randn(2, 3, 4)
    concat = RoleConcat(roles)
    assert concat.roles == ("q", "k", "v") and concat.k is roles["k"]
    assert torch.allclose(concat(x), fused(x), atol=1e-6)
    swapped = RoleConcat({r: roles[r] for r in ("k", "q", "v")})
    assert not torch.allclose(swapped(x), fused(x), atol=1e-3)
    assert sorted(concat.state_dict()) == ["k.bias", "k.weight", "q.bias", "q.weight", "v.bias", "v.weight"]


def test_phi3s_fused_projections_are_viewed_by_role():
    """Phi-3 fuses q, k, v into ``qkv_proj`` and gate, up into ``gate_up_proj``: the adapter hands the
    sharding math one view per role, in the fused weight's order, covering all of it."""
    config = load_config("phi-3", tiny=True)
    family = family_for(config.model_type)
    layer = family.decoder_layers(build_model(config))[0]
    attention, mlp = family.layer_projections(layer, 0)
    fused = layer.self_attn.qkv_proj.weight
    rows = [attention[r].weight for r in ("q", "k", "v")]
    assert all(isinstance(attention[r], RoleView) for r in ("q", "k", "v"))
    assert torch.equal(torch.cat(rows), fused) and rows[1].data_ptr() == fused[rows[0].shape[0]].data_ptr()
    gate_up = layer.mlp.gate_up_proj.weight
    assert torch.equal(torch.cat([mlp["gate"].weight, mlp["up"].weight]), gate_up)


def test_the_tiny_variants_use_the_demo_tokenizers_special_ids():
    for name in ("gemma-4-e2b", "llama"):
        config = load_config(name, tiny=True)
        ids = family_for(config.model_type).special_ids(config)
        assert isinstance(ids, SpecialIds)
        assert ids.bos == TINY_SPECIAL_IDS["bos_token_id"] and TINY_SPECIAL_IDS["eos_token_id"] in ids.eos
        assert ids.pad == TINY_SPECIAL_IDS["pad_token_id"]
    assert build_model(load_config("gemma-4-e2b", tiny=True)).config.vocab_size == TINY_VOCAB
