"""Buffers a parameter-only load drops (Gemma-4's per-layer scalar): audited by name against the
checkpoint, and restored from it."""

from neuron_port.model.buffers import audit_buffers, parameter_only_load, persistent_buffers, restore_buffers
from neuron_port.model.configs import load_config
from neuron_port.model.loading import build_model


def test_a_parameter_only_load_is_named_by_the_audit_and_restored(tiny_e2b):
    checkpoint = tiny_e2b.state_dict()
    scalars = sorted(name for name in persistent_buffers(tiny_e2b) if name.endswith("layer_scalar"))
    assert scalars and not audit_buffers(tiny_e2b, checkpoint)
    loaded = build_model(load_config("gemma-4-e2b", tiny=True), seed=1)  # other weights, then NxD's kind of load
    parameter_only_load(loaded, checkpoint)
    assert all(float(loaded.get_buffer(name).flatten()[0]) == 1.0 for name in scalars)  # the default, not the checkpoint's
    diffs = audit_buffers(loaded, checkpoint)
    assert sorted(d.name for d in diffs) == scalars and all("differs" in str(d) for d in diffs)
    assert sorted(restore_buffers(loaded, checkpoint)) == sorted(persistent_buffers(loaded))
    assert not audit_buffers(loaded, checkpoint)
    missing = {k: v for k, v in checkpoint.items() if k != scalars[0]}
    assert [str(d) for d in audit_buffers(loaded, missing)] == [f"{scalars[0]}: missing from checkpoint"]
