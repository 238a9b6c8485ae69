"""Memory traffic of one optimized HLO module, read from its text: bytes per instruction class.

On Inferentia2 a decode step is bound by HBM traffic, and the optimized HLO torch-xla produces is
the program neuronx-cc receives, so its traffic can be counted without a device. The model is the
simple one a roofline uses: every instruction of the entry computation reads its operands once and
writes its result once (a fusion counts as one instruction: its inside stays on chip). Free
instructions move nothing: ``parameter``, ``constant``, ``tuple``, ``get-tuple-element``,
``bitcast``. A ``call`` moves what the computation it calls moves (XLA's CPU backend outlines
parallel loops into calls). An in-place update (``dynamic-update-slice``, ``scatter``, or a fusion
whose root is one) reads and writes only its update, as a buffer that is aliased is updated where
it lies. A ``gather`` or ``dynamic-slice`` reads only what it selects: an operand (of the
instruction, or of a fusion whose parameter feeds only such slices, directly or through converts
and reshapes) counts the bytes of the slices taken from it, so an embedding lookup costs its rows,
not its table.

Classes, by opcode (a fusion by what its computation holds): ``dot`` (``dot``, ``convolution``),
``kv_write`` (``dynamic-update-slice``, ``scatter``), ``copy``, ``all_reduce``, and
``elementwise`` (everything else: selects, blends, reductions, converts).

:func:`decode_cost` sets one decode step's traffic against the least any decode step at that
context must move: the device weights read once, the K/V each attending layer reads at that context
(a layer that shares another's K/V reads it too: sharing saves memory, not traffic), and the new
rows written (step inputs and logits, a few KB, are left out of both).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from neuron_port.graph.kv import KVStoreSpec

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\dm\d\w*)?)\[([\d,]*)\]")
_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\((?:[^()]|\([^()]*\))*\)|\S+)\s+"
                   r"(?P<opcode>[a-z][\w\-]*)\((?P<operands>[^)]*)\)(?P<attrs>.*)$")
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_TO_APPLY = re.compile(r"to_apply=%?([\w.\-]+)")
_COMMENT = re.compile(r"/\*.*?\*/")
FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id", "replica-id"}
IN_PLACE = {"dynamic-update-slice", "scatter"}
SLICING = {"gather", "dynamic-slice"}
PASS_THROUGH = {"convert", "bitcast", "reshape", "copy", "bitcast-convert"}
CLASSES = ("dot", "kv_write", "copy", "all_reduce", "elementwise")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape (``f32[2,16]{1,0}``, or a tuple of them); 0 for tokens and opaque types."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        size = _DTYPE_BYTES.get(dtype)
        if size is None:
            continue
        count = 1
        for dim in filter(None, dims.split(",")):
            count *= int(dim)
        total += size * count
    return total


def _computations(text: str) -> tuple[str, dict[str, list[re.Match]]]:
    """(the entry computation's name, every computation's instruction lines)."""
    computations: dict[str, list[re.Match]] = {}
    entry, current = "", None
    for line in text.splitlines():
        head = _COMPUTATION.match(line)
        if head and "=" not in _COMMENT.sub("", line).split("{")[0]:
            current = head.group("name")
            computations[current] = []
            entry = current if head.group("entry") else entry
            continue
        found = _LINE.match(line)
        if found and current is not None:
            computations[current].append(found)
    return entry, computations


def _operands(text: str) -> list[str]:
    """Operand names of an instruction's argument list (``/*index=5*/`` comments dropped)."""
    return [part.strip().split()[-1].lstrip("%") for part in _COMMENT.sub("", text).split(",") if part.strip()]


def _class_of(opcode: str, called: list[re.Match] | None) -> str:
    opcodes = {opcode} if called is None else {m.group("opcode") for m in called}
    if opcodes & {"dot", "convolution"}:
        return "dot"
    if opcodes & IN_PLACE:
        return "kv_write"
    if opcodes & {"all-reduce", "all-reduce-start"}:
        return "all_reduce"
    if opcodes == {"copy"} or opcode == "copy":
        return "copy"
    return "elementwise"


def _in_place_bytes(line: re.Match, called: list[re.Match] | None, sizes: dict[str, int]) -> int | None:
    """Read and write bytes of an in-place update (its update operand, twice), or None when it is not one."""
    root = line if called is None else next((m for m in called if m.group(0).lstrip().startswith("ROOT")), None)
    if root is None or root.group("opcode") not in IN_PLACE:
        return None
    names = _operands(root.group("operands"))
    local = sizes if called is None else {m.group("name"): shape_bytes(m.group("shape")) for m in called}
    update = names[1] if root.group("opcode") == "dynamic-update-slice" else names[-1]
    return 2 * local.get(update, 0)


def _elements(shape: str) -> int:
    """Elements of an array shape (the first array of a tuple)."""
    found = _ARRAY.search(shape)
    count = 1
    for dim in filter(None, found.group(2).split(",") if found else []):
        count *= int(dim)
    return count


def _sliced_elements(name: str, called: list[re.Match]) -> int | None:
    """Elements of ``name`` a fusion reads when every use of it ends, through element-wise reshapes
    and converts (computed element by element inside a fusion), in a gather or dynamic-slice of it;
    None when some use reads it whole."""
    users = [m for m in called if name in _operands(m.group("operands"))]
    if not users:
        return None
    taken = 0
    for user in users:
        if user.group("opcode") in SLICING and _operands(user.group("operands"))[0] == name:
            taken += _elements(user.group("shape"))
        elif user.group("opcode") in PASS_THROUGH and (inner := _sliced_elements(user.group("name"), called)) is not None:
            taken += inner
        else:
            return None
    return taken


def _fused_operand_bytes(called: list[re.Match], sizes: list[int]) -> list[int]:
    """Bytes a fusion reads of each operand: all of it, or only the slices its parameter feeds."""
    params = {int(m.group("operands")): m for m in called if m.group("opcode") == "parameter"}
    out = []
    for index, size in enumerate(sizes):
        param = params.get(index)
        taken = _sliced_elements(param.group("name"), called) if param is not None else None
        if taken is not None:
            size = min(size, taken * size // max(1, _elements(param.group("shape"))))
        out.append(size)
    return out


def _read_bytes(line: re.Match, called: list[re.Match] | None, sizes: dict[str, int]) -> int:
    """Bytes an instruction reads of its operands."""
    operands = [sizes.get(operand, 0) for operand in _operands(line.group("operands"))]
    if called is not None:
        return sum(_fused_operand_bytes(called, operands))
    if line.group("opcode") in SLICING and operands:
        operands[0] = min(operands[0], sizes[line.group("name")])
    return sum(operands)


def _add_traffic(computation: str, computations: dict[str, list[re.Match]], out: Counter) -> None:
    """Add what ``computation``'s instructions move to ``out``; a ``call`` (XLA's CPU backend outlines
    parallel work into them) moves what the computation it calls moves."""
    sizes: dict[str, int] = {}
    for line in computations.get(computation, []):
        name, opcode = line.group("name"), line.group("opcode")
        sizes[name] = shape_bytes(line.group("shape"))
        if opcode in FREE:
            continue
        if opcode == "call":
            target = _TO_APPLY.search(line.group("attrs"))
            if target is not None and target.group(1) in computations and target.group(1) != computation:
                _add_traffic(target.group(1), computations, out)
                continue
        calls = _CALLS.search(line.group("attrs"))
        called = computations.get(calls.group(1)) if opcode == "fusion" and calls else None
        moved = _in_place_bytes(line, called, sizes)
        if moved is None:
            moved = sizes[name] + _read_bytes(line, called, sizes)
        out[_class_of(opcode, called)] += moved


def traffic(text: str) -> dict[str, int]:
    """Bytes each instruction class of the module's entry computation reads and writes, and ``total``."""
    entry, computations = _computations(text)
    out: Counter = Counter({name: 0 for name in CLASSES})
    _add_traffic(entry, computations, out)
    result = {name: out[name] for name in CLASSES}
    result["total"] = sum(result.values())
    return result


def minimum_decode_bytes(weight_bytes: int, store: KVStoreSpec, context: int, batch: int, dtype_bytes: int,
                         readers: dict[int, int] | None = None) -> int:
    """The least a decode step at ``context`` moves on one device: weights + the K/V every attending
    layer reads (``readers``: see :meth:`~neuron_port.graph.kv.KVStoreSpec.attended_bytes`) + new rows."""
    attended = store.attended_bytes(context, batch, dtype_bytes, readers)
    return weight_bytes + attended + store.row_bytes(batch, dtype_bytes)


def decode_cost(moved: dict[str, int], weight_bytes: int, store: KVStoreSpec, context: int, batch: int,
                dtype_bytes: int, readers: dict[int, int] | None = None) -> dict[str, Any]:
    """``{bytes, minimum_bytes, ratio, by_class, context}`` of one decode step whose :func:`traffic` is
    ``moved`` (per device: ``weight_bytes`` and ``store`` are one device's)."""
    if weight_bytes <= 0:
        raise ValueError(f"weight_bytes must be positive, found {weight_bytes}")
    minimum = minimum_decode_bytes(weight_bytes, store, context, batch, dtype_bytes, readers)
    return {"bytes": moved["total"], "minimum_bytes": minimum, "ratio": round(moved["total"] / minimum, 4),
            "by_class": {name: moved[name] for name in CLASSES}, "context": context}


__all__ = ["CLASSES", "shape_bytes", "traffic", "minimum_decode_bytes", "decode_cost"]
