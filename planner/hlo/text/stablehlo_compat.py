"""StableHLO text written by one jax release, in the forms the installed jaxlib's MLIR reads.

Two forms changed between jax 0.7.1 and jax 0.12, and each jaxlib reads only its own:

- A boolean dense constant in hex. jax 0.7.1's MLIR packs an `i1` tensor eight elements to a byte,
  least significant bit first; jax 0.12's writes one byte per element. Example: the 16x16 causal mask
  whose row 1 is `true, true, false...` is `0x...0300...` packed (32 bytes) and `0x...0101000...` one
  byte per element (256 bytes). Each reader calls the other's data size invalid ("elements hex data
  size is invalid").
- A collective's `replica_groups` over mesh axes: jax 0.12 writes
  `#stablehlo.replica_group_mesh_axes<mesh = @mesh, axes = [#stablehlo.axis_ref<name = "tp">]>` inside a
  shard_map, where jax 0.7.1 writes the device groups themselves (`dense<[[0, 1], [2, 3]]> :
  tensor<2x2xi64>`), which every release reads.

Which form the installed MLIR reads is asked of it (a probe attribute each), never assumed from a
version number, and only text in the form it cannot read is rewritten, into one that means the same.
"""

from __future__ import annotations

import re
from typing import Any

from planner.sharding.shardy import AxisRef, SdyMesh, ShardyTextError, parse_mesh, replica_groups_over

# `dense<"0x...."> : tensor<4x16xi1>`: hex data of a boolean tensor.
_BOOL_HEX = re.compile(r'dense<"0x([0-9A-Fa-f]*)">(\s*:\s*tensor<((?:\d+x)*)i1>)')
_MESH_AXES = re.compile(r"#stablehlo\.replica_group_mesh_axes<")
_MESH_DECLARATION = re.compile(r'sdy\.mesh\s+@([\w.$-]+)\s*=\s*(<\[(?:[^\]"]|"[^"]*")*\][^>]*>)')
# Inside a mesh MLIR prints its axes without the attribute's prefix: `<name = "x", size = 2>`.
_MESH_AXIS = re.compile(r'(?:#stablehlo\.mesh_axis)?<\s*name\s*=\s*"([^"]*)"\s*,\s*size\s*=\s*(\d+)\s*>')
# `#stablehlo.axis_ref<name = "y">`, or a sub-axis: `<name = "y", sub_axis_info = (1)2>` (pre-size, size).
_AXIS_REF = re.compile(
    r'#stablehlo\.axis_ref<\s*name\s*=\s*"([^"]*)"\s*(?:,\s*sub_axis_info\s*=\s*\((\d+)\)(\d+)\s*)?>'
)
_MESH_SYMBOL = re.compile(r"\s*mesh(?:_name)?\s*=\s*@([\w.$-]+)\s*,")
_INLINE_MESH = re.compile(r"\s*mesh\s*=\s*#stablehlo\.mesh<\s*axes\s*=\s*\[")


class CompatibilityError(ValueError):
    """Text in a form the installed jaxlib does not read and this module cannot rewrite; `offset` is where."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def readable_text(text: str, ir: Any) -> str:
    """`text` with every form the current MLIR context cannot parse rewritten into one it can.

    Must be called inside the context the module will be parsed in (JAX's, with StableHLO and Shardy
    registered)."""
    # Replica groups first: their errors' offsets are into the text as written.
    if _MESH_AXES.search(text) and not _reads(ir, "#stablehlo.replica_group_mesh_axes<mesh = @m, axes = []>"):
        text = _explicit_replica_groups(text)
    if "i1>" in text:
        text = _bools_in_own_layout(text, _reads_bytes_per_bool(ir))
    return text


def _reads(ir: Any, attribute: str) -> bool:
    try:
        ir.Attribute.parse(attribute)
    except Exception:  # MLIRError or ValueError, by release: either means it does not read the form
        return False
    return True


def _reads_bytes_per_bool(ir: Any) -> bool:
    """Whether this MLIR stores a boolean tensor one byte per element (else eight to a byte)."""
    return _reads(ir, 'dense<"0x01000100000000000000"> : tensor<10xi1>')


def _bools_in_own_layout(text: str, bytes_per_bool: bool) -> str:
    def convert(found: re.Match[str]) -> str:
        data = bytes.fromhex(found.group(1))
        count = 1
        for size in found.group(3).split("x")[:-1]:
            count *= int(size)
        packed_size = (count + 7) // 8
        # One byte is ambiguous up to eight elements (a splat in either layout, or the packed bits); MLIR
        # prints such small constants as a literal list anyway, so they stay as written.
        if bytes_per_bool and len(data) == packed_size and count > 8:
            data = bytes((data[i // 8] >> (i % 8)) & 1 for i in range(count))
        elif not bytes_per_bool and len(data) == count != packed_size:
            packed = bytearray(packed_size)
            for i, value in enumerate(data):
                if value:
                    packed[i // 8] |= 1 << (i % 8)
            data = bytes(packed)
        else:
            return found.group(0)
        return f'dense<"0x{data.hex().upper()}">{found.group(2)}'

    return _BOOL_HEX.sub(convert, text)


def _explicit_replica_groups(text: str) -> str:
    """Every `#stablehlo.replica_group_mesh_axes<...>` as the device groups it names, a dense i64 matrix."""
    meshes = _declared_meshes(text)
    pieces: list[str] = []
    pos = 0
    for found in _MESH_AXES.finditer(text):
        if found.start() < pos:
            continue
        end = _closing(text, found.end(), found.start())
        groups = _groups(text[found.end() : end], found.end(), meshes)
        rows = ", ".join("[" + ", ".join(map(str, group)) + "]" for group in groups)
        pieces += [text[pos : found.start()], f"dense<[{rows}]> : tensor<{len(groups)}x{len(groups[0])}xi64>"]
        pos = end + 1
    return "".join(pieces) + text[pos:]


def _declared_meshes(text: str) -> dict[str, SdyMesh]:
    meshes: dict[str, SdyMesh] = {}
    for found in _MESH_DECLARATION.finditer(text):
        try:
            meshes[found.group(1)] = parse_mesh(found.group(2))
        except ShardyTextError as e:
            raise CompatibilityError(f"sdy.mesh @{found.group(1)}: {e}", found.start(2) + e.offset) from None
    return meshes


def _closing(text: str, start: int, opened_at: int) -> int:
    """The index of the `>` that closes the `<` just before `start` (nested `<...>` and strings skipped)."""
    depth = 1
    pos = start
    while pos < len(text):
        char = text[pos]
        if char == '"':
            pos = text.index('"', pos + 1) if '"' in text[pos + 1 :] else len(text)
        elif char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
            if depth == 0:
                return pos
        pos += 1
    raise CompatibilityError("#stablehlo.replica_group_mesh_axes<...> is not closed", opened_at)


def _groups(body: str, offset: int, meshes: dict[str, SdyMesh]) -> tuple[tuple[int, ...], ...]:
    """`mesh = @m, axes = [...]` or `mesh = #stablehlo.mesh<axes = [...]>, axes = [...]`."""
    symbol = _MESH_SYMBOL.match(body)
    if symbol is not None:
        if symbol.group(1) not in meshes:
            known = ", ".join(f"@{name}" for name in meshes) or "none"
            raise CompatibilityError(f"replica groups over mesh @{symbol.group(1)}, which the module does not "
                                     f"declare (sdy.mesh: {known})", offset)  # fmt: skip
        mesh = meshes[symbol.group(1)]
        rest = body[symbol.end() :]
    elif _INLINE_MESH.match(body):
        inline_end = _closing(body, body.index("<") + 1, offset + body.index("<"))
        mesh = SdyMesh(tuple((name, int(size)) for name, size in _MESH_AXIS.findall(body[: inline_end + 1])))
        rest = body[inline_end + 1 :].lstrip().removeprefix(",")
    else:
        raise CompatibilityError("replica groups over mesh axes name no mesh this planner reads "
                                 "(mesh = @name or mesh = #stablehlo.mesh<...>)", offset)  # fmt: skip
    refs = [AxisRef(name, int(pre), int(size)) if pre else AxisRef(name)
            for name, pre, size in _AXIS_REF.findall(rest)]  # fmt: skip
    if not refs:
        raise CompatibilityError("replica groups over mesh axes list no axis_ref this planner reads", offset)
    try:
        return replica_groups_over(mesh, refs)
    except ValueError as e:
        raise CompatibilityError(f"replica groups over mesh axes: {e}", offset) from None
