"""The HLO traffic reader: bytes per instruction class of an optimized module's entry computation,
counted on modules written the way XLA dumps them (fusions as one instruction, aliased in-place
updates as their update only)."""

import pytest

from neuron_port.backends.hlo_cost import decode_cost, minimum_decode_bytes, shape_bytes, traffic
from neuron_port.graph.kv import KVSlotSpec, KVStoreSpec

MODULE = """HloModule decode, is_scheduled=true, input_output_alias={ {1}: (1, {}, may-alias) }
%fused_blend (param_0: f32[2,16,32], param_1: f32[2,32], param_2: pred[2,16]) -> f32[2,16,32] {
  %param_2 = pred[2,16]{1,0} parameter(2)
  %broadcast.1 = pred[2,16,32]{2,1,0} broadcast(%param_2), dimensions={0,1}
  %param_1 = f32[2,32]{1,0} parameter(1)
  %broadcast.2 = f32[2,16,32]{2,1,0} broadcast(%param_1), dimensions={0,2}
  %param_0 = f32[2,16,32]{2,1,0} parameter(0)
  ROOT %select.1 = f32[2,16,32]{2,1,0} select(%broadcast.1, %broadcast.2, %param_0)
}
%fused_update (param_0.1: f32[2,16,32], param_1.1: f32[2,32], param_2.1: s32[]) -> f32[2,16,32] {
  %param_0.1 = f32[2,16,32]{2,1,0} parameter(0)
  %param_1.1 = f32[2,32]{1,0} parameter(1)
  %bitcast.9 = f32[2,1,32]{2,1,0} bitcast(%param_1.1)
  %param_2.1 = s32[] parameter(2)
  %constant.9 = s32[] constant(0)
  ROOT %dus.1 = f32[2,16,32]{2,1,0} dynamic-update-slice(%param_0.1, %bitcast.9, %constant.9, %param_2.1, %constant.9)
}
ENTRY %main (p0.1: f32[2,64], p1.2: f32[2,16,32], /*index=2*/p2.3: pred[2,16], p3.4: s32[]) -> (f32[2,32], f32[2,16,32]) {
  %p0.1 = f32[2,64]{1,0} parameter(0)
  %constant.1 = bf16[64,32]{1,0} constant({...})
  %convert.1 = f32[64,32]{1,0} convert(%constant.1)
  %dot.1 = f32[2,32]{1,0} dot(%p0.1, %convert.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %p1.2 = f32[2,16,32]{2,1,0} parameter(1)
  %p2.3 = pred[2,16]{1,0} parameter(2)
  %blend = f32[2,16,32]{2,1,0} fusion(%p1.2, %dot.1, %p2.3), kind=kLoop, calls=%fused_blend
  %p3.4 = s32[] parameter(3)
  %update = f32[2,16,32]{2,1,0} fusion(%p1.2, %dot.1, %p3.4), kind=kLoop, calls=%fused_update
  %copy.1 = f32[2,16,32]{2,1,0} copy(%update)
  %all-reduce.1 = f32[2,32]{1,0} all-reduce(%dot.1), replica_groups={}, to_apply=%add
  ROOT %tuple.1 = (f32[2,32]{1,0}, f32[2,16,32]{2,1,0}, /*index=2*/f32[2,16,32]) tuple(%all-reduce.1, %blend, /*index=2*/%copy.1)
}
"""
KV, ROW, WEIGHT_BF16, WEIGHT_F32 = 2 * 16 * 32 * 4, 2 * 32 * 4, 64 * 32 * 2, 64 * 32 * 4


@pytest.mark.parametrize("shape,size", [("f32[2,16]{1,0}", 128), ("bf16[64,32]", 4096), ("pred[2,16,1]{2,1,0}", 32),
                                        ("s64[]", 8), ("(f32[2]{0}, bf16[4]{0})", 16), ("token[]", 0)])
def test_shape_bytes(shape, size):
    assert shape_bytes(shape) == size


def test_each_class_counts_what_its_instructions_read_and_write():
    got = traffic(MODULE)
    # the weight is read once in bf16 by its convert, which writes it in f32 for the dot to read
    assert got["dot"] == 2 * 64 * 4 + WEIGHT_F32 + ROW
    # the blend reads the whole store, the new row and the mask, and writes the whole store: the cost
    # the one-hot KV write has; the in-place update moves its row only
    assert got["elementwise"] == (WEIGHT_BF16 + WEIGHT_F32) + (KV + ROW + 2 * 16 + KV)
    assert got["kv_write"] == 2 * (2 * 1 * 32 * 4)
    assert got["copy"] == 2 * KV and got["all_reduce"] == 2 * ROW
    assert got["total"] == sum(v for k, v in got.items() if k != "total")


def test_free_instructions_move_nothing():
    module = """HloModule m
ENTRY %e (p: f32[8]) -> (f32[8]) {
  %p = f32[8]{0} parameter(0)
  %b = f32[2,4]{1,0} bitcast(%p)
  ROOT %t = (f32[2,4]{1,0}) tuple(%b)
}
"""
    assert traffic(module)["total"] == 0


LOOKUP = """HloModule lookup
%fused_rows (param_0: f32[1000,8], param_1: s32[2,1]) -> f32[2,8] {
  %param_0 = f32[1000,8]{1,0} parameter(0)
  %param_1 = s32[2,1]{1,0} parameter(1)
  ROOT %gather.1 = f32[2,8]{1,0} gather(%param_0, %param_1), slice_sizes={1,8}
}
%fused_scale (param_0.2: f32[1000,8], param_1.2: s32[2,1]) -> f32[2,8] {
  %param_0.2 = f32[1000,8]{1,0} parameter(0)
  %param_1.2 = s32[2,1]{1,0} parameter(1)
  %gather.2 = f32[2,8]{1,0} gather(%param_0.2, %param_1.2), slice_sizes={1,8}
  %reduce.2 = f32[8]{0} reduce(%param_0.2, %param_0.2), dimensions={0}, to_apply=%add
  ROOT %b = f32[2,8]{1,0} broadcast(%reduce.2), dimensions={1}
}
ENTRY %main (table: f32[1000,8], ids: s32[2,1], start: s32[]) -> (f32[2,8], f32[2,8], f32[4,8]) {
  %table = f32[1000,8]{1,0} parameter(0)
  %ids = s32[2,1]{1,0} parameter(1)
  %start = s32[] parameter(2)
  %rows = f32[2,8]{1,0} fusion(%table, %ids), kind=kLoop, calls=%fused_rows
  %scaled = f32[2,8]{1,0} fusion(%table, %ids), kind=kLoop, calls=%fused_scale
  %zero = s32[] constant(0)
  %slice = f32[4,8]{1,0} dynamic-slice(%table, %start, %zero), dynamic_slice_sizes={4,8}
  ROOT %t = (f32[2,8]{1,0}, f32[2,8]{1,0}, f32[4,8]{1,0}) tuple(%rows, %scaled, %slice)
}
"""


def test_a_lookup_reads_its_rows_not_its_table():
    """A gather (alone or fused) or a dynamic-slice reads the rows it takes; a fusion that also reduces
    the whole table reads all of it."""
    rows, ids, table = 2 * 8 * 4, 2 * 4, 1000 * 8 * 4
    got = traffic(LOOKUP)
    fused_rows = rows + ids + rows
    fused_scale = table + ids + rows
    dynamic_slice = 4 * 8 * 4 + 4 + 4 + 4 * 8 * 4
    assert got["elementwise"] == fused_rows + fused_scale + dynamic_slice


def _store(window=None):
    full = KVSlotSpec(layer=0, attention="full", n_kv=2, head_dim=4, slots=64, ring=False)
    ring = KVSlotSpec(layer=1, attention="sliding", n_kv=1, head_dim=8, slots=16, ring=True)
    return KVStoreSpec(kv_len=64, window=16, slots=(full, ring))


def test_the_minimum_is_weights_attended_kv_and_new_rows():
    store = _store()
    # at 10 positions: the full owner's 10, the ring's 10; at 64: all 64 and the window's 16
    assert store.attended_bytes(10, batch=1, dtype_bytes=2) == 2 * (2 * 10 * 4 + 1 * 10 * 8) * 2
    assert store.attended_bytes(64, batch=3, dtype_bytes=2) == 3 * 2 * (2 * 64 * 4 + 1 * 16 * 8) * 2
    assert store.row_bytes(batch=3, dtype_bytes=4) == 3 * 2 * (2 * 4 + 8) * 4
    assert minimum_decode_bytes(1000, store, 64, 1, 2) == 1000 + store.attended_bytes(64, 1, 2) + store.row_bytes(1, 2)
    # a layer sharing the full owner's K/V reads it as well: three readers read it three times
    shared = store.attended_bytes(64, 1, 2, readers={0: 3, 1: 1})
    assert shared == store.attended_bytes(64, 1, 2) + 2 * (2 * 2 * 64 * 4 * 2)
    assert minimum_decode_bytes(1000, store, 64, 1, 2, {0: 3, 1: 1}) == 1000 + shared + store.row_bytes(1, 2)


def test_decode_cost_sets_the_traffic_against_the_minimum():
    store = _store()
    moved = traffic(MODULE)
    cost = decode_cost(moved, 1000, store, 64, 1, 4)
    assert cost["bytes"] == moved["total"] and cost["minimum_bytes"] == minimum_decode_bytes(1000, store, 64, 1, 4)
    assert cost["ratio"] == round(moved["total"] / cost["minimum_bytes"], 4)
    assert sum(cost["by_class"].values()) == moved["total"]
    with pytest.raises(ValueError, match="weight_bytes must be positive, found 0"):
        decode_cost(moved, 0, store, 64, 1, 4)
