"""Host logits: the softcap never changes the argmax."""


import torch
from hypothesis import given
from hypothesis import strategies as st

from neuron_port.generation.logits import softcap


@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=2, max_size=64), st.floats(1.0, 100.0))
def test_argmax_is_softcap_invariant(values, cap):
    x = torch.tensor([values], dtype=torch.float64)
    capped = softcap(x, cap)
    # ties after capping can only come from values that saturate to the same float
    best = capped.max()
    assert capped[0, torch.argmax(x, dim=-1)[0]] == best
