"""Read chosen tensors of a safetensors file straight into their final host tensors.

``safe_open(...).get_tensor`` (safetensors 0.8) hands back tensors backed by a memory map of
the file: resident only where touched, so a decode step's embedding gather can page-fault into
the file (disk reads inside the token loop), and a file replaced while serving breaks the
mapping. The slim host wants its tables in memory before the first request: here each tensor
is allocated once at its final size and filled with ``readinto`` from the file, so resident
memory is the tensors' own bytes, with no second copy at any point (the file's pages go to the
kernel's page cache, not to the process).

Format: 8-byte little-endian header length, a JSON header ``{name: {dtype, shape,
data_offsets: [begin, end]}}`` (offsets relative to the end of the header), then the data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path

import torch

from neuron_port.errors import TensorFileError

SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool,
}
_MAX_HEADER = 100 * 2**20
_CHUNK = 64 * 2**20


def read_header(path: str | Path) -> tuple[dict[str, dict], int]:
    """(tensor entries by name, byte offset where the data starts)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise TensorFileError(f"{path}: expected a safetensors header, found a {size}-byte file")
        (length,) = struct.unpack("<Q", raw)
        if length > min(_MAX_HEADER, size - 8):
            raise TensorFileError(f"{path}: header length {length} does not fit a {size}-byte file")
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TensorFileError(f"{path}: malformed safetensors header: {exc}") from None
    header.pop("__metadata__", None)
    start = 8 + length
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise TensorFileError(f"{path}: tensor {name}: dtype {entry['dtype']} is not supported")
        want = SAFETENSORS_DTYPES[entry["dtype"]].itemsize * _numel(entry["shape"])
        if end - begin != want or start + end > size:
            raise TensorFileError(f"{path}: tensor {name}: expected {want} bytes at {begin}..{end} within "
                                  f"{size - start} data bytes")
    return header, start


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def read_tensors(path: str | Path, names: Iterable[str],
                 header: tuple[dict[str, dict], int] | None = None) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of one file, each read once into its own allocation.

    ``header`` is :func:`read_header`'s result when the caller has already read it.
    """
    header, start = header or read_header(path)
    out: dict[str, torch.Tensor] = {}
    with open(path, "rb", buffering=0) as fh:
        for name in names:
            if name not in header:
                raise TensorFileError(f"{path}: no tensor named {name}")
            entry = header[name]
            tensor = torch.empty(entry["shape"], dtype=SAFETENSORS_DTYPES[entry["dtype"]])
            flat = tensor.reshape(-1)  # a view (fresh tensors are contiguous); 0-d tensors become 1-d
            view = memoryview(flat.view(torch.uint8).numpy()).cast("B") if tensor.numel() else memoryview(b"")
            fh.seek(start + entry["data_offsets"][0])
            done = 0
            while done < len(view):
                got = fh.readinto(view[done : done + _CHUNK])
                if not got:
                    raise TensorFileError(f"{path}: tensor {name} ends early ({done} of {len(view)} bytes)")
                done += got
            out[name] = tensor
    return out


__all__ = ["SAFETENSORS_DTYPES", "read_header", "read_tensors"]
