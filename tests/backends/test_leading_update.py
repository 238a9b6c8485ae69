"""The prefill's leading-slice write: off an XLA device it is ``slice_scatter`` (the torch-xla path, one
dynamic-update-slice in the lowered HLO, runs in ``tests/xla/test_xla_port.py``)."""

import pytest
import torch

from neuron_port.backends.leading_update import leading_update


def test_the_leading_update_writes_the_first_slots_and_keeps_the_rest():
    g = torch.Generator().manual_seed(0)
    buf, head = torch.randn(2, 3, 10, 4, generator=g), torch.randn(2, 3, 6, 4, generator=g)
    out = leading_update(buf, head)
    assert torch.equal(out[:, :, :6], head) and torch.equal(out[:, :, 6:], buf[:, :, 6:])
    assert not torch.equal(out, buf) and out.data_ptr() != buf.data_ptr()  # a new tensor; buf untouched
    with pytest.raises(ValueError, match="does not fit a buffer"):
        leading_update(buf, torch.zeros(2, 3, 11, 4))
