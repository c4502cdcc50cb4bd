"""Shardy shardings as XLA's HLO text now writes them natively, and their HloSharding.

XLA (the one jax 0.12 carries) prints a Shardy sharding in the `sharding=` attribute itself,
with its mesh inline, where older XLA wrote a GSPMD sharding and kept Shardy's in
`frontend_attributes={xla.sdy.sharding=...}`:

    sharding={mesh['fsdp'=2,'tp'=4], [{'fsdp'}, {}, {}]}
    sharding={mesh['fsdp'=2,'tp'=4], replicated}
    sharding={{mesh['x'=8], [{'x':(1)2}, {?}]}, {mesh['x'=8], [{}, {'x', ?}]p1}}   (a tuple)

    named  := '{' 'mesh' '[' axis (',' axis)* ']' [',' 'device_ids=[' ids ']'] ','
              ('replicated' | 'manual' | dims) (',' key '={' refs '}')* '}'
    axis   := "'" name "'" '=' size
    dims   := '[' [dim (',' dim)*] ']'
    dim    := '{' [ref (',' ref)*] [[','] '?'] '}' ['p' priority]
    ref    := "'" name "'" [':(' pre_size ')' size]          -- a sub-axis: `'x':(2)4`
    key    := 'replicated' | 'unreduced' | 'manual'

The values are Shardy's (`planner.sharding.shardy`): a mesh, per dim the axes it is split over
major to minor, open (`?`) or closed, with a priority. Only the data placement reaches the
HloSharding (`to_hlo_sharding`); manual axes become a trailing `manual` tile dim, as XLA's
export writes a shard_map's body. Example: `{mesh['fsdp'=2,'tp'=4], [{}, {'tp'}, {'fsdp'}]}` on
a rank-3 value is `{devices=[1,4,2]<=[2,4]T(1,0)}`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from planner.scanner import Cursor, skip_balanced
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.shardy import (
    AxisRef,
    DimSharding,
    SdyMesh,
    TensorSharding,
    replica_groups_over,
    to_hlo_sharding,
)
from planner.sharding.tile_assignment import TileAssignment

_MESH_START = re.compile(r"\{\s*(?:mesh|single_device|maximal_mesh)\s*\[")
_QUOTED_NAME = re.compile(r"'((?:[^'\\\n]|\\.)*)'")
_INT = re.compile(r"\d+")
_KEY = re.compile(r"[a-z_]+")
_PRIORITY = re.compile(r"p(\d+)")
_SINGLE_DEVICE = re.compile(r"(?:single_device|maximal_mesh)\s*\[\s*")
_IOTA_IDS = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\](?:\s*T\s*\(\s*(\d+(?:\s*,\s*\d+)*)\s*\))?")
_REDUCTION = re.compile(r"(?:sum|max|min)(?=\s*\{)")


@dataclass(frozen=True, slots=True)
class NamedSharding:
    """One value's Shardy sharding as XLA writes it natively: the mesh written inline, and the axes
    that are manual (inside a shard_map body) besides the dims' and the replicated ones."""

    mesh: SdyMesh
    sharding: TensorSharding
    manual: tuple[AxisRef, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.sharding.dims)


def is_named_sharding(text: str, pos: int = 0) -> bool:
    """Whether the sharding at `pos` (its opening brace) is written natively (`{mesh[...], ...}`)."""
    return _MESH_START.match(text, pos) is not None


def read_mesh_axes(cursor: Cursor) -> list[tuple[str, int]]:
    """`mesh['fsdp'=2,'tp'=4]`: the axes with their sizes, major to minor."""
    cursor.skip_space()
    cursor.expect("mesh", "to start a mesh")
    cursor.skip_space()
    cursor.expect("[", "to open the mesh's axes")
    axes: list[tuple[str, int]] = []
    if not cursor.try_literal("]"):
        while True:
            name = _quoted(cursor, "a mesh axis name in quotes, like 'fsdp'")
            cursor.expect("=", f"after mesh axis '{name}'")
            axes.append((name, cursor.parse_int(f"the size of mesh axis '{name}'")))
            if cursor.try_literal("]"):
                break
            cursor.expect(",", "or ']' between mesh axes")
    return axes


def read_mesh_replica_groups(cursor: Cursor) -> tuple[tuple[int, ...], ...]:
    """`mesh['fsdp'=2,'tp'=4] {'tp'}` (a collective's `replica_groups` over mesh axes): one group per setting of
    the other axes, each holding the devices that differ along the named axes, in the order named. Example:
    over mesh ['fsdp'=2,'tp'=4], {'tp'} is {{0,1,2,3},{4,5,6,7}} and {'fsdp'} is {{0,4},{1,5},{2,6},{3,7}}."""
    start = cursor.skip_space()
    axes = read_mesh_axes(cursor)
    device_ids: tuple[int, ...] = ()
    if cursor.try_literal(","):
        cursor.skip_space()
        cursor.expect("device_ids", "(a mesh's device ids) after ','")
        cursor.expect("=")
        device_ids = _int_list(cursor)
    cursor.skip_space()
    refs = _axis_set(cursor)
    try:
        return replica_groups_over(SdyMesh(tuple(axes), device_ids), list(refs))
    except ValueError as e:
        cursor.fail(str(e), start)


def read_named_body(cursor: Cursor) -> NamedSharding:
    """Reads `mesh[...], ...}` after a sharding's opening brace, up to and including its closing one."""
    mesh_pos = cursor.skip_space()
    if cursor.try_match(_SINGLE_DEVICE) is not None:
        # `{single_device[device_id=3]}` (older XLA: `maximal_mesh[...]`): everything on one device.
        cursor.expect("device_id", "in single_device[device_id=N]")
        cursor.expect("=")
        device = cursor.parse_int("a device id")
        cursor.expect("]", "to close single_device[...]")
        if cursor.try_literal(","):
            cursor.skip_space()
            cursor.expect("metadata", "after ','")
            cursor.expect("=")
            skip_balanced(cursor, "the sharding's metadata")
        cursor.expect("}", "to close the named sharding")
        return NamedSharding(SdyMesh((), (device,)), TensorSharding(SdyMesh((), (device,)), ()))
    axes = read_mesh_axes(cursor)
    device_ids: tuple[int, ...] = ()
    dims: tuple[DimSharding, ...] = ()
    extra: dict[str, tuple[AxisRef, ...]] = {}
    read_dims = False
    while cursor.try_literal(","):
        pos = cursor.skip_space()
        if cursor.peek() == "[":
            if read_dims:
                cursor.fail("a named sharding has one list of dims", pos)
            dims, read_dims = _dims(cursor), True
            continue
        key = cursor.match(_KEY, "dims [...], replicated, device_ids=(...) or an axis set like manual={...}").group(0)
        if key in ("replicated", "manual", "unreduced") and not cursor.text.startswith("=", cursor.skip_space()):
            # Fully replicated, manual (a shard_map's body) or unreduced: no dims are written, whatever the rank.
            if key != "replicated":
                extra[key] = tuple(AxisRef(name) for name, _ in axes)
            read_dims = True
            continue
        cursor.expect("=", f"after '{key}'")
        if key == "device_ids":
            device_ids = _device_ids(cursor, axes)
        elif key == "metadata":
            skip_balanced(cursor, "the named sharding's metadata")
        elif key in ("replicated", "unreduced", "manual"):
            if key in extra:
                cursor.fail(f"'{key}' is given twice", pos)
            if key == "unreduced":
                cursor.try_match(_REDUCTION)  # how the partial values combine: placement is the same
            extra[key] = _axis_set(cursor)
        else:
            cursor.fail(f"unknown key '{key}' in a named sharding", pos)
    cursor.expect("}", "to close the named sharding")
    if not read_dims:
        cursor.fail("a named sharding needs its dims [...] or replicated", mesh_pos)
    try:
        mesh = SdyMesh(tuple(axes), device_ids)
        sharding = TensorSharding(mesh, dims, extra.get("replicated", ()), extra.get("unreduced", ()))
    except ValueError as e:
        cursor.fail(str(e), mesh_pos)
    return NamedSharding(mesh, sharding, extra.get("manual", ()))


@lru_cache(maxsize=4096)
def parse_named_sharding(text: str) -> tuple[NamedSharding | None, ...]:
    """Each value's named sharding in `text` (one `{...}`, or a tuple `{{...}, {...}}`), None for a value
    written the classic way: XLA mixes both in one tuple (`{{mesh[], replicated}, {replicated}, ...}`).
    `text` is a sharding the HLO parser has already read (`planner.sharding.text`)."""
    cursor = Cursor(text)
    if not text.startswith("{{", cursor.skip_space()):
        return (_element(cursor),)
    cursor.expect("{")
    values = []
    while True:
        values.append(_element(cursor))
        if cursor.try_literal("}"):
            return tuple(values)
        cursor.expect(",", "or '}' between tuple element shardings")


def _element(cursor: Cursor) -> NamedSharding | None:
    start = cursor.skip_space()
    if not is_named_sharding(cursor.text, start):
        skip_balanced(cursor, "a tuple element's sharding")
        return None
    cursor.expect("{", "to open a sharding")
    return read_named_body(cursor)


def named_to_hlo(named: NamedSharding) -> HloSharding:
    """The HloSharding that places data as `named` does (the module docstring's example)."""
    sharding = named.sharding
    if not named.manual:
        if not sharding.dims:
            return HloSharding.maximal(named.mesh.device_ids[0]) if named.mesh.is_maximal else HloSharding.replicate()
        if sharding.unreduced:
            # Unreduced axes hold partial sums: the data is placed as the dims say, the sum comes later.
            sharding = TensorSharding(sharding.mesh, sharding.dims, sharding.replicated)
        return to_hlo_sharding(sharding, {}, len(sharding.dims))
    return _with_manual(named)


def _with_manual(named: NamedSharding) -> HloSharding:
    """Manual axes as a trailing `manual` tile dim (after a `replicated` one), XLA's subgroup form."""
    mesh = named.mesh
    manual_names = {a.name for a in named.manual}
    if any(a.pre_size is not None for a in named.manual):
        raise ValueError("manual sub-axes have no HloSharding form")
    if manual_names == {name for name, _ in mesh.axes} and not any(d.axes for d in named.sharding.dims):
        return HloSharding.manual()
    # Put the manual axes last in the mesh, so that the placement's leftover axes split in two groups:
    # the replicated ones, then the manual ones.
    import numpy as np

    order = [i for i, (n, _) in enumerate(mesh.axes) if n not in manual_names]
    order += [i for i, (n, _) in enumerate(mesh.axes) if n in manual_names]
    sizes = [s for _, s in mesh.axes]
    ids = np.asarray(mesh.device_ids or range(mesh.num_devices)).reshape(sizes).transpose(order).reshape(-1)
    auto = SdyMesh(tuple(mesh.axes[i] for i in order), tuple(int(d) for d in ids))
    placed = to_hlo_sharding(TensorSharding(auto, named.sharding.dims, named.sharding.replicated), {}, named.rank)
    # Devices per tile dim, the leftover (replicated, then manual: minor) last.
    if placed.tile_assignment is None:
        devices = ids.reshape((1,) * named.rank + (-1,))
    else:
        devices = placed.tile_assignment.array()
        if not placed.replicate_on_last_tile_dim:
            devices = devices.reshape((*devices.shape, 1))
    manual_size = math.prod(mesh.size_of(n) for n in manual_names)
    replicated = devices.shape[-1] // manual_size
    dims = (*devices.shape[: named.rank], *((replicated,) if replicated > 1 else ()), manual_size)
    tiles = TileAssignment.from_devices(devices.reshape(-1).tolist(), dims)
    types = ("replicated", "manual") if replicated > 1 else ("manual",)
    return HloSharding.subgroup(tiles, types)


def _quoted(cursor: Cursor, what: str) -> str:
    return cursor.match(_QUOTED_NAME, what).group(1)


def _device_ids(cursor: Cursor, axes: list[tuple[str, int]]) -> tuple[int, ...]:
    """`(0,2,1,3)`, or an iota `([4,2]T(1,0))`, over the mesh's devices (older text: `[0,2,1,3]`)."""
    if cursor.peek() == "[":
        return _int_list(cursor)
    cursor.expect("(", "to open the mesh's device ids")
    if cursor.peek() == "[":
        m = cursor.match(_IOTA_IDS, "an iota like [4,2]T(1,0)")
        reshape = tuple(int(x) for x in m.group(1).split(","))
        perm = tuple(int(x) for x in m.group(2).split(",")) if m.group(2) else None
        try:
            ids = TileAssignment.from_iota((math.prod(reshape),), reshape, perm).flat_devices
        except ValueError as e:
            cursor.fail(str(e), m.start())
    else:
        listed: list[int] = []
        while True:
            listed.append(cursor.parse_int("a device id"))
            if cursor.peek() == ")":
                break
            cursor.expect(",", "or ')' between device ids")
        ids = tuple(listed)
    cursor.expect(")", "to close the mesh's device ids")
    if len(ids) != math.prod(size for _, size in axes):
        cursor.fail(f"{len(ids)} device ids for a mesh of {math.prod(size for _, size in axes)} devices")
    return tuple(ids)


def _int_list(cursor: Cursor) -> tuple[int, ...]:
    cursor.expect("[", "to open a list of device ids")
    ids: list[int] = []
    if not cursor.try_literal("]"):
        while True:
            ids.append(cursor.parse_int("a device id"))
            if cursor.try_literal("]"):
                break
            cursor.expect(",", "or ']' between device ids")
    return tuple(ids)


def _axis_ref(cursor: Cursor) -> AxisRef:
    name = _quoted(cursor, "a mesh axis name in quotes, like 'fsdp'")
    if not cursor.try_literal(":"):
        return AxisRef(name)
    cursor.expect("(", f"to open the sub-axis of '{name}', like 'x':(2)4")
    pre_size = cursor.parse_int("the sub-axis's pre-size")
    cursor.expect(")", "after the sub-axis's pre-size")
    return AxisRef(name, pre_size, cursor.parse_int("the sub-axis's size"))


def _axis_set(cursor: Cursor) -> tuple[AxisRef, ...]:
    cursor.expect("{", "to open an axis set")
    refs: list[AxisRef] = []
    if not cursor.try_literal("}"):
        while True:
            refs.append(_axis_ref(cursor))
            if cursor.try_literal("}"):
                break
            cursor.expect(",", "or '}' between axes")
    return tuple(refs)


def _dims(cursor: Cursor) -> tuple[DimSharding, ...]:
    cursor.expect("[", "to open the dims")
    dims: list[DimSharding] = []
    if cursor.try_literal("]"):
        return ()
    while True:
        dims.append(_dim(cursor))
        if cursor.try_literal("]"):
            return tuple(dims)
        cursor.expect(",", "or ']' between dims")


def _dim(cursor: Cursor) -> DimSharding:
    cursor.expect("{", "to open a dim's axes")
    refs: list[AxisRef] = []
    is_open = False
    if not cursor.try_literal("}"):
        while True:
            if cursor.try_literal("?"):
                is_open = True
                cursor.expect("}", "after '?' (an open dim ends with it)")
                break
            refs.append(_axis_ref(cursor))
            if cursor.try_literal("}"):
                break
            cursor.expect(",", "or '}' between a dim's axes")
    priority = None
    if cursor.text.startswith("p", cursor.pos):
        found = cursor.try_match(_PRIORITY)
        if found is not None:
            priority = int(found.group(1))
    return DimSharding(tuple(refs), is_open, priority)
