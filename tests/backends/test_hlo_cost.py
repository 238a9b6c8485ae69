"""The HLO traffic reader: bytes per instruction class of an optimized module's entry computation,
counted on modules written the way XLA dumps them (fusions as one instruction, aliased in-place
updates as their update only)."""

import pytest

from neuron_port.backends.hlo_cost import shape_bytes, traffic

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
