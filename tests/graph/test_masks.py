"""Prefill masks equal Hugging Face's definition, sliding windows included."""


import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.models.gemma4.modeling_gemma4 import sliding_window_mask_function

from neuron_port.graph import masks


@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 30))
def test_prefill_masks_match_hf_definition(batch, bucket, window):
    full, sliding = masks.prefill_masks(torch.ones(batch, dtype=torch.long), bucket, window)
    hf_visible = sliding_window_mask_function((window, 0))
    for q in range(bucket):
        for k in range(bucket):
            assert (sliding[0, 0, q, k] == 0) == bool(hf_visible(0, 0, q, k))
            assert (full[0, 0, q, k] == 0) == (k <= q)
