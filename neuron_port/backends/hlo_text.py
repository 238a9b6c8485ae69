"""Facts read from an XLA HLO module's text (the ``*after_optimizations.txt`` files XLA dumps).

Pure string parsing, so it is tested without torch-xla. For an SPMD program the optimized module
is the per-device (partitioned) program: its collectives are the ones each device runs.

* instructions: every ``name = shape opcode(...)`` line, in every computation (fusions included;
  tuple shapes nested one level deep, as XLA writes them);
* opcodes: how many instructions of each opcode;
* aliased buffers: entries of the module's ``input_output_alias`` (outputs that reuse an
  input's buffer: a KV store that stays resident);
* dynamic dimensions: shapes with bounded-dynamic sizes (``f32[<=32]``), which the Neuron
  compiler refuses;
* int8 weights: the entry computation's ``s8`` parameters (an int8 model's projections, kept as
  int8 on the device) and the ``convert`` instructions that widen an ``s8`` operand (the cast next
  to each matmul).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>\((?:[^()]|\([^()]*\))*\)|\S+)\s+(?P<opcode>[a-z][\w\-]*)\(", re.M
)
_ALIAS = re.compile(r"input_output_alias=\{(?P<body>.*?)\}\s*(?:,\s*\w+=|$)", re.S)
_ALIAS_ENTRY = re.compile(r"\{[\d,\s]*\}\s*:\s*\(")
_DYNAMIC_DIM = re.compile(r"\[[^\]]*<=[^\]]*\]")
_S8_ARRAY = re.compile(r"^s8\[([\d,]*)\]")
_NAMED = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\S+)\s+(?P<opcode>[a-z][\w\-]*)\("
                    r"\s*%?(?P<operand>[\w.\-]*)", re.M)

# HLO opcodes the Neuron compiler is documented not to take: control flow ("Neuron Control Flow":
# not implemented by the Neuron compiler, awsdocs-neuron general/arch/neuron-features/control-flow).
NEURON_REJECTED_OPCODES = {
    "while": "data-dependent control flow: not implemented by the Neuron compiler (Neuron docs, 'Neuron Control Flow')",
    "conditional": "data-dependent control flow: not implemented by the Neuron compiler (Neuron docs, 'Neuron Control Flow')",
}
DYNAMIC_SHAPE_NOTE = "dynamically sized dimension: neuronx-cc requires static shapes (Neuron error NCC_EMOD025)"


@dataclass
class HloSummary:
    """What one HLO module holds."""

    instructions: int = 0
    opcodes: Counter = field(default_factory=Counter)
    aliased_buffers: int = 0
    dynamic_dimensions: int = 0
    int8_parameters: int = 0
    int8_parameter_bytes: int = 0
    int8_converts: int = 0

    def to_json(self) -> dict:
        return {
            "instructions": self.instructions,
            "opcodes": dict(sorted(self.opcodes.items())),
            "aliased_buffers": self.aliased_buffers,
            "dynamic_dimensions": self.dynamic_dimensions,
            "int8_parameters": self.int8_parameters,
            "int8_parameter_bytes": self.int8_parameter_bytes,
            "int8_converts": self.int8_converts,
        }


def header(text: str) -> str:
    """The ``HloModule ...`` line (aliases and layouts live there)."""
    for line in text.splitlines():
        if line.startswith("HloModule"):
            return line
    return ""


def aliased_buffers(text: str) -> int:
    """Entries of the module's ``input_output_alias`` map (0 when it has none)."""
    match = _ALIAS.search(header(text))
    return len(_ALIAS_ENTRY.findall(match.group("body"))) if match else 0


def entry_computation(text: str) -> str:
    """The text of the module's ``ENTRY`` computation (empty when it has none)."""
    start = text.find("\nENTRY ")
    if start < 0:
        return ""
    end = text.find("\n}", start)
    return text[start:] if end < 0 else text[start:end]


def int8_parameters(text: str) -> tuple[int, int]:
    """(count, bytes) of the entry computation's ``s8`` array parameters."""
    count = size = 0
    for match in _INSTRUCTION.finditer(entry_computation(text)):
        array = _S8_ARRAY.match(match.group("shape"))
        if match.group("opcode") == "parameter" and array:
            count += 1
            elements = 1
            for dim in filter(None, array.group(1).split(",")):
                elements *= int(dim)
            size += elements
    return count, size


def int8_converts(text: str) -> int:
    """``convert`` instructions whose operand is an ``s8`` array (XLA names are unique in a module, and
    an operand is written by name only, so its shape is looked up)."""
    shapes, converts = {}, []
    for match in _NAMED.finditer(text):
        shapes[match.group("name")] = match.group("shape")
        if match.group("opcode") == "convert":
            converts.append(match.group("operand"))
    return sum(1 for operand in converts if shapes.get(operand, "").startswith("s8["))


def summarize(text: str) -> HloSummary:
    """Instruction and opcode counts, aliased buffers and dynamic dimensions of one module's text."""
    summary = HloSummary()
    for match in _INSTRUCTION.finditer(text):
        summary.instructions += 1
        summary.opcodes[match.group("opcode")] += 1
        if _DYNAMIC_DIM.search(match.group("shape")):
            summary.dynamic_dimensions += 1
    summary.aliased_buffers = aliased_buffers(text)
    summary.int8_parameters, summary.int8_parameter_bytes = int8_parameters(text)
    summary.int8_converts = int8_converts(text)
    return summary


__all__ = ["HloSummary", "NEURON_REJECTED_OPCODES", "DYNAMIC_SHAPE_NOTE", "header", "aliased_buffers",
           "entry_computation", "int8_parameters", "int8_converts", "summarize"]
