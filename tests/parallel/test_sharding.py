"""GQA tensor-parallel sharding: property tests of the plan, and sharded attention == unsharded."""


import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from neuron_port.errors import ShardingError
from neuron_port.parallel.sharding import head_columns, head_rows, plan_attention, valid_tp_degrees


@st.composite
def head_configs(draw):
    n_kv = draw(st.integers(1, 16))
    group = draw(st.integers(1, max(1, 64 // n_kv)))
    n_q = n_kv * group
    tp = draw(st.sampled_from([d for d in range(1, n_q + 1) if n_q % d == 0]))
    return n_q, n_kv, tp


@given(head_configs())
def test_plan_maps_every_query_to_its_unsharded_kv_head(cfg):
    n_q, n_kv, tp = cfg
    plan = plan_attention(n_q, n_kv, tp)
    group = n_q // n_kv
    seen_q = []
    for rank in plan.ranks:
        assert len(rank.q_heads) == n_q // tp
        seen_q.extend(rank.q_heads)
        # the invariant: local mapping reproduces the unsharded head mapping
        for j, h in enumerate(rank.q_heads):
            assert rank.kv_heads[rank.kv_for_q[j]] == h // group
        # no duplicates, and no KV head that none of this rank's queries uses
        assert len(set(rank.kv_heads)) == len(rank.kv_heads)
        assert set(rank.kv_heads) == {h // group for h in rank.q_heads}
        if rank.groups is not None:
            assert all(rank.kv_for_q[j] == j // rank.groups for j in range(len(rank.q_heads)))
    assert sorted(seen_q) == list(range(n_q))
    if tp == 1 or n_kv % tp == 0 or tp % n_kv == 0 or n_kv == 1:
        assert plan.uniform
    if n_kv % tp == 0:  # sharded: no duplication at all
        assert sum(len(r.kv_heads) for r in plan.ranks) == n_kv


@given(st.integers(1, 64), st.integers(1, 16), st.integers(-2, 12))
def test_invalid_degrees_raise_value_errors_naming_valid_ones(n_q, n_kv, tp):
    valid = n_kv >= 1 and n_q % n_kv == 0 and tp >= 1 and n_q % tp == 0
    if valid:
        plan_attention(n_q, n_kv, tp)
        return
    with pytest.raises(ValueError) as err:
        plan_attention(n_q, n_kv, tp)
    assert str(n_q) in str(err.value)
    if n_q % n_kv == 0:
        assert str(valid_tp_degrees(n_q, n_kv)) in str(err.value)


# ---- numerical equivalence -----------------------------------------------------------------
def _attention(x, wq, wk, wv, wo, n_q, n_kv, d, kv_index):
    """Causal attention; query head j attends KV head kv_index[j]. x [seq, hidden] -> [seq, hidden]."""
    s = x.shape[0]
    q = (x @ wq.T).view(s, n_q, d).transpose(0, 1)
    k = (x @ wk.T).view(s, n_kv, d).transpose(0, 1)[kv_index]
    v = (x @ wv.T).view(s, n_kv, d).transpose(0, 1)[kv_index]
    scores = q @ k.transpose(1, 2) / d**0.5
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    out = torch.softmax(scores, -1) @ v  # [n_q, seq, d]
    return out.transpose(0, 1).reshape(s, n_q * d) @ wo.T


def _weights(n_q, n_kv, d, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return r(5, hidden), r(n_q * d, hidden), r(n_kv * d, hidden), r(n_kv * d, hidden), r(hidden, n_q * d)


def _unsharded(x, wq, wk, wv, wo, n_q, n_kv, d):
    return _attention(x, wq, wk, wv, wo, n_q, n_kv, d, torch.arange(n_q) // (n_q // n_kv))


def _sharded_by_plan(x, wq, wk, wv, wo, n_q, n_kv, d, tp):
    total = 0
    for rank in plan_attention(n_q, n_kv, tp).ranks:
        total = total + _attention(
            x,
            head_rows(wq, rank.q_heads, d),
            head_rows(wk, rank.kv_heads, d),
            head_rows(wv, rank.kv_heads, d),
            head_columns(wo, rank.q_heads, d),
            len(rank.q_heads),
            len(rank.kv_heads),
            d,
            torch.tensor(rank.kv_for_q),
        )
    return total


@given(head_configs(), st.integers(0, 10_000))
def test_sharded_attention_equals_unsharded(cfg, seed):
    n_q, n_kv, tp = cfg
    d, hidden = 4, 8
    x, wq, wk, wv, wo = _weights(n_q, n_kv, d, hidden, seed)
    expected = _unsharded(x, wq, wk, wv, wo, n_q, n_kv, d)
    got = _sharded_by_plan(x, wq, wk, wv, wo, n_q, n_kv, d, tp)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_naive_divide_everything_rule_is_wrong_for_8q_2kv_tp2():
    """Sharding K/V *and* dividing the repeat factor by tp: the '4-vs-8 repeat_kv' mismatch."""
    n_q, n_kv, tp, d, hidden = 8, 2, 2, 4, 8
    x, wq, wk, wv, wo = _weights(n_q, n_kv, d, hidden, 3)
    expected = _unsharded(x, wq, wk, wv, wo, n_q, n_kv, d)
    naive_groups = (n_q // n_kv) // tp  # 2 instead of 4
    total, failed = 0, False
    for r in range(tp):
        q_heads = tuple(range(r * 4, r * 4 + 4))
        kv_heads = (r,)
        kv_index = torch.arange(4) // naive_groups  # asks for local KV heads 0,0,1,1 of 1
        try:
            total = total + _attention(
                x, head_rows(wq, q_heads, d), head_rows(wk, kv_heads, d), head_rows(wv, kv_heads, d),
                head_columns(wo, q_heads, d), 4, 1, d, kv_index,
            )
        except IndexError:
            failed = True
    assert failed or not torch.allclose(total, expected)
    torch.testing.assert_close(_sharded_by_plan(x, wq, wk, wv, wo, n_q, n_kv, d, tp), expected)


def test_field_report_replicate_rule_is_wrong_for_12q_3kv_tp2():
    """Replicate all K/V and set groups = (n_q / tp) / n_kv: right only when n_kv == 1."""
    n_q, n_kv, tp, d, hidden = 12, 3, 2, 4, 8
    x, wq, wk, wv, wo = _weights(n_q, n_kv, d, hidden, 4)
    expected = _unsharded(x, wq, wk, wv, wo, n_q, n_kv, d)
    groups = (n_q // tp) // n_kv  # 2
    total = 0
    for r in range(tp):
        q_heads = tuple(range(r * 6, r * 6 + 6))
        total = total + _attention(
            x, head_rows(wq, q_heads, d), wk, wv, head_columns(wo, q_heads, d), 6, n_kv, d, torch.arange(6) // groups
        )
    assert not torch.allclose(total, expected, atol=1e-6)
    torch.testing.assert_close(_sharded_by_plan(x, wq, wk, wv, wo, n_q, n_kv, d, tp), expected)


def test_straddling_case_6q_3kv_tp2():
    plan = plan_attention(6, 3, 2)
    assert plan.strategy == "straddle" and not plan.uniform
    assert [r.kv_heads for r in plan.ranks] == [(0, 1), (1, 2)]
    assert [r.kv_for_q for r in plan.ranks] == [(0, 0, 1), (0, 1, 1)]
    x, wq, wk, wv, wo = _weights(6, 3, 4, 8, 5)
    torch.testing.assert_close(
        _sharded_by_plan(x, wq, wk, wv, wo, 6, 3, 4, 2), _unsharded(x, wq, wk, wv, wo, 6, 3, 4)
    )


def test_gemma_cases():
    e4b = plan_attention(8, 2, 2)
    assert [r.kv_heads for r in e4b.ranks] == [(0,), (1,)] and {r.groups for r in e4b.ranks} == {4}
    sliding_12b = plan_attention(16, 8, 2)
    assert [len(r.kv_heads) for r in sliding_12b.ranks] == [4, 4]
    global_12b = plan_attention(16, 1, 2)
    assert [r.kv_heads for r in global_12b.ranks] == [(0,), (0,)] and {r.groups for r in global_12b.ranks} == {8}
    assert global_12b.kv_replication == 2 and global_12b.strategy == "replicate"
    with pytest.raises(ShardingError):
        plan_attention(8, 2, 3)
