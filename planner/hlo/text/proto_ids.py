"""Give a serialized HloModuleProto's computations ids no instruction uses.

XLA's text parser numbers computations and instructions from separate
counters, so a module read from text has computation 2 and instruction 2.
An `XlaBuilder` importing such a module as a called computation (torch_xla's
user computations do) remaps both kinds of id through one table: the
computation's new id is overwritten by an instruction's, and the build fails
with "Computation N not found in builder". Moving every computation id above
the largest instruction id makes the two sets disjoint.

Only the fields that hold computation ids are rewritten; every other byte of
the proto is carried over as it was. Field numbers are xla/service/hlo.proto's:

    HloModuleProto       computations = 3, entry_computation_id = 6
    HloComputationProto  instructions = 2, id = 5
    HloInstructionProto  id = 35, called_computation_ids = 38 (packed)
"""

from __future__ import annotations

_MODULE_COMPUTATIONS = 3
_MODULE_ENTRY_ID = 6
_COMPUTATION_INSTRUCTIONS = 2
_COMPUTATION_ID = 5
_INSTRUCTION_ID = 35
_INSTRUCTION_CALLED_IDS = 38

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5

# (field number, wire type, value): value is an int for varints, bytes otherwise.
Field = tuple[int, int, int | bytes]


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def decode(data: bytes) -> list[Field]:
    """One message's fields in order; nested messages stay bytes until decoded themselves."""
    fields: list[Field] = []
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, i = _read_varint(data, i)
        elif wire == _FIXED64:
            value, i = data[i : i + 8], i + 8
        elif wire == _FIXED32:
            value, i = data[i : i + 4], i + 4
        elif wire == _LENGTH:
            size, i = _read_varint(data, i)
            value, i = data[i : i + size], i + size
        else:
            raise ValueError(f"HloModuleProto: field {number} has wire type {wire}, which HLO protos do not use")
        fields.append((number, wire, value))
    return fields


def encode(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == _VARINT:
            assert isinstance(value, int)
            out += _varint(value)
        else:
            assert isinstance(value, bytes)
            out += (_varint(len(value)) if wire == _LENGTH else b"") + value
    return bytes(out)


def _first(fields: list[Field], number: int) -> int:
    # proto3 omits fields holding their default: an absent id is 0.
    for n, wire, value in fields:
        if n == number and wire == _VARINT:
            assert isinstance(value, int)
            return value
    return 0


def _ids(number: int, wire: int, value: int | bytes) -> list[int]:
    if wire == _VARINT:
        assert isinstance(value, int)
        return [value]
    assert isinstance(value, bytes)
    ids, i = [], 0
    while i < len(value):
        v, i = _read_varint(value, i)
        ids.append(v)
    return ids


def separate_computation_ids(proto: bytes) -> bytes:
    """The same module with computation ids moved above every instruction id."""
    module = decode(proto)
    computations = [decode(v) for n, _, v in module if n == _MODULE_COMPUTATIONS and isinstance(v, bytes)]
    instruction_ids = [
        _first(decode(v), _INSTRUCTION_ID)
        for c in computations
        for n, _, v in c
        if n == _COMPUTATION_INSTRUCTIONS and isinstance(v, bytes)
    ]
    base = max(instruction_ids, default=-1) + 1
    new_id = {_first(c, _COMPUTATION_ID): base + k for k, c in enumerate(computations)}

    def instruction(data: bytes) -> bytes:
        fields: list[Field] = []
        for n, wire, value in decode(data):
            if n == _INSTRUCTION_CALLED_IDS:
                ids = [new_id[i] for i in _ids(n, wire, value)]
                fields.extend((n, _VARINT, i) for i in ids)
            else:
                fields.append((n, wire, value))
        return encode(fields)

    def computation(fields: list[Field]) -> bytes:
        out: list[Field] = [(n, w, v) for n, w, v in fields if n != _COMPUTATION_ID]
        out = [(n, w, instruction(v) if n == _COMPUTATION_INSTRUCTIONS and isinstance(v, bytes) else v)
               for n, w, v in out]  # fmt: skip
        return encode([*out, (_COMPUTATION_ID, _VARINT, new_id[_first(fields, _COMPUTATION_ID)])])

    rewritten: list[Field] = []
    remaining = iter(computations)
    for n, wire, value in module:
        if n == _MODULE_COMPUTATIONS:
            rewritten.append((n, wire, computation(next(remaining))))
        elif n != _MODULE_ENTRY_ID:
            rewritten.append((n, wire, value))
    rewritten.append((_MODULE_ENTRY_ID, _VARINT, new_id[_first(module, _MODULE_ENTRY_ID)]))
    return encode(rewritten)
