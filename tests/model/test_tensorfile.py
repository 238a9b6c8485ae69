"""The slim safetensors reader gives exactly what safetensors itself reads, and refuses broken files."""


from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from neuron_port.errors import TensorFileError
from neuron_port.model.tensorfile import read_header, read_tensors

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.int8]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 7), min_size=0, max_size=3)),
                min_size=1, max_size=4), st.integers(0, 2**16))
def test_reads_what_safetensors_reads(tmp_path_factory, specs, seed):
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, (dtype, shape) in enumerate(specs):
        t = torch.randn(shape, generator=gen) * 50
        tensors[f"t{i}.weight"] = t.to(dtype)
    path = tmp_path_factory.mktemp("st") / "x.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    got = read_tensors(path, list(tensors)[::-1])
    with safe_open(str(path), framework="pt") as fh:
        for name in tensors:
            ref = fh.get_tensor(name)
            assert got[name].dtype == ref.dtype and got[name].shape == ref.shape
            assert torch.equal(got[name], ref)


def test_refuses_truncated_and_malformed_files(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"a": torch.arange(1000, dtype=torch.float32)}, str(path))
    data = path.read_bytes()
    (tmp_path / "short.safetensors").write_bytes(data[:-10])
    with pytest.raises(TensorFileError, match="expected 4000 bytes"):
        read_header(tmp_path / "short.safetensors")
    (tmp_path / "tiny.safetensors").write_bytes(b"abc")
    with pytest.raises(TensorFileError, match="expected a safetensors header"):
        read_header(tmp_path / "tiny.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 5) + b"{not json" + data[8:])
    with pytest.raises(TensorFileError, match="malformed"):
        read_header(tmp_path / "bad.safetensors")
    with pytest.raises(TensorFileError, match="no tensor named b"):
        read_tensors(path, ["b"])
