"""Shardy's sharding attributes as XLA prints them, and their GSPMD equivalents.

A module lowered with JAX's default partitioner (Shardy) carries its meshes
and shardings as `frontend_attributes` holding Shardy's MLIR attribute text:

    HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["fsdp"=4, "tp"=2]>}}
    p = f32[8,16,16] parameter(0),
        frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{}, {\"fsdp\"}, {\"tp\"}]>"}

A tensor sharding names a mesh and, per tensor dim, the mesh axes it is split
over, major to minor. A dim is closed (`{"fsdp"}`: propagation may not add
axes) or open (`{"fsdp", ?}`, `{?}`: it may); `p0`, `p1`, ... after a dim give
its priority. An axis reference is a whole axis (`"tp"`) or a sub-axis
(`"x":(2)4`: the factor of size 4 of axis x whose more-major factors multiply
to 2, so an axis x of size 16 splits as [2, 4, 2] major to minor and this is
the middle one).

Worked example of the GSPMD conversion: mesh ["fsdp"=4, "tp"=2] over devices
0..7 (device 2*i + j at fsdp=i, tp=j), tensor f32[16,16] sharded
[{"tp"}, {}]. Dim 0 is split 2 ways over tp, dim 1 not at all, and fsdp is
left over: it becomes a trailing replicated tile dim. The device array
[[0,1],[2,3],[4,5],[6,7]] (fsdp x tp) is transposed to put tp first,
[[0,2,4,6],[1,3,5,7]], and reshaped to tiles [2,1,4]:
`{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}`, as XLA's own export
writes it.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.tile_assignment import TileAssignment

T = TypeVar("T")


class ShardyTextError(ValueError):
    """Malformed Shardy attribute text; `offset` is where in the text it went wrong."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True, slots=True)
class SdyMesh:
    """Named axes with sizes, major to minor, over `device_ids` (row-major iota when empty)."""

    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        names = [n for n, _ in self.axes]
        if len(set(names)) != len(names):
            raise ValueError(f"mesh axes {names} repeat a name")
        if any(size < 1 for _, size in self.axes):
            raise ValueError(f"mesh axes {list(self.axes)} must have positive sizes")
        count = math.prod(size for _, size in self.axes)
        # A maximal mesh (no axes, one device id) names any device; otherwise the ids permute 0..count-1.
        if self.device_ids and not self.is_maximal and sorted(self.device_ids) != list(range(count)):
            raise ValueError(f"device_ids {list(self.device_ids)} are not a permutation of 0..{count - 1}")

    @property
    def num_devices(self) -> int:
        return math.prod(size for _, size in self.axes)

    @property
    def is_maximal(self) -> bool:
        """`#sdy.mesh<[], device_ids=[3]>`: everything on one device."""
        return not self.axes and len(self.device_ids) == 1

    def size_of(self, axis: str) -> int:
        for name, size in self.axes:
            if name == axis:
                return size
        raise KeyError(axis)

    def to_text(self) -> str:
        axes = ", ".join(f'"{n}"={s}' for n, s in self.axes)
        ids = f", device_ids=[{', '.join(map(str, self.device_ids))}]" if self.device_ids else ""
        return f"#sdy.mesh<[{axes}]{ids}>"


@dataclass(frozen=True, slots=True)
class AxisRef:
    """A mesh axis, or the sub-axis of size `size` whose more-major factors multiply to `pre_size`."""

    name: str
    pre_size: int | None = None
    size: int | None = None

    def to_text(self) -> str:
        sub = f":({self.pre_size}){self.size}" if self.pre_size is not None else ""
        return f'"{self.name}"{sub}'


@dataclass(frozen=True, slots=True)
class DimSharding:
    axes: tuple[AxisRef, ...] = ()
    is_open: bool = False
    priority: int | None = None

    def to_text(self) -> str:
        parts = [a.to_text() for a in self.axes] + (["?"] if self.is_open else [])
        return "{" + ", ".join(parts) + "}" + (f"p{self.priority}" if self.priority is not None else "")


# How a value's unreduced axes are still to be reduced (Shardy's `ReductionOp`); a sum is written bare.
REDUCTIONS = ("sum", "max", "min")


@dataclass(frozen=True, slots=True)
class TensorSharding:
    """`<@mesh, [dims...], replicated={...}, unreduced={...}>` for one value.

    `unreduced=max{"c"}`: the unreduced axes hold partial maxima, not partial sums (jaxlib >= 0.12).
    """

    mesh: str | SdyMesh  # a name from the module's meshes, or a mesh written inline
    dims: tuple[DimSharding, ...]
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()
    reduction: str = "sum"

    @property
    def open_dims(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.dims) if d.is_open)

    def to_text(self) -> str:
        mesh = f"@{self.mesh}" if isinstance(self.mesh, str) else self.mesh.to_text()[len("#sdy.") :]
        reduction = "" if self.reduction == "sum" else self.reduction
        extra = "".join(
            f", {key}={kind}{{{', '.join(a.to_text() for a in refs)}}}"
            for key, kind, refs in (("replicated", "", self.replicated), ("unreduced", reduction, self.unreduced))
            if refs
        )
        return f"<{mesh}, [{', '.join(d.to_text() for d in self.dims)}]{extra}>"


# --- Reading -----------------------------------------------------------------------------------

_SPACE = re.compile(r"\s*")
_IDENT = re.compile(r"[A-Za-z_][\w.$\-]*")
_INT = re.compile(r"-?\d+")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


class ShardyReader:
    """A cursor over Shardy attribute text: literals, patterns and comma lists, errors with their offset."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def fail(self, message: str) -> ShardyTextError:
        found = self.text[self.pos : self.pos + 12]
        return ShardyTextError(f"{message}, found {found!r}" if found else f"{message}, found the end", self.pos)

    def try_literal(self, literal: str) -> bool:
        self.skip()
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def expect(self, literal: str, what: str) -> None:
        if not self.try_literal(literal):
            raise self.fail(f"expected '{literal}' {what}")

    def match(self, pattern: re.Pattern[str], what: str) -> re.Match[str]:
        self.skip()
        m = pattern.match(self.text, self.pos)
        if m is None:
            raise self.fail(f"expected {what}")
        self.pos = m.end()
        return m

    def int(self, what: str) -> int:
        return int(self.match(_INT, what).group(0))

    def string(self, what: str) -> str:
        return self.match(_QUOTED, what).group(1)

    def end(self) -> None:
        self.skip()
        if self.pos != len(self.text):
            raise self.fail("unexpected text after the attribute")

    def comma_list(self, close: str, item: Callable[[], T], what: str) -> list[T]:
        items: list[T] = []
        if self.try_literal(close):
            return items
        while True:
            items.append(item())
            if self.try_literal(close):
                return items
            self.expect(",", f"or '{close}' in {what}")


def _mesh_body(r: ShardyReader) -> SdyMesh:
    """`<["a"=2, "b"=4], device_ids=[...]>` after `mesh`."""
    r.skip()
    start = r.pos
    r.expect("<", "to open a mesh")
    r.expect("[", "to open the mesh axes")

    def axis() -> tuple[str, int]:
        name = r.string('a quoted axis name like "fsdp"')
        r.expect("=", f'after axis "{name}"')
        return name, r.int(f'the size of axis "{name}"')

    axes = r.comma_list("]", axis, "the mesh axes")
    device_ids: list[int] = []
    if r.try_literal(","):
        r.match(re.compile(r"device_ids"), "device_ids=[...]")
        r.expect("=", "after device_ids")
        r.expect("[", "to open device_ids")
        device_ids = r.comma_list("]", lambda: r.int("a device id"), "device_ids")
    r.expect(">", "to close the mesh")
    try:
        return SdyMesh(tuple(axes), tuple(device_ids))
    except ValueError as e:
        raise ShardyTextError(str(e), start) from None


def _axis_ref(r: ShardyReader) -> AxisRef:
    name = r.string('a quoted axis name like "fsdp"')
    if r.try_literal(":"):
        r.expect("(", f'to open the pre-size of sub-axis "{name}"')
        pre = r.int("a sub-axis pre-size")
        r.expect(")", "after the sub-axis pre-size")
        size = r.int("a sub-axis size")
        if pre < 1 or size < 1:
            raise r.fail(f'sub-axis "{name}":({pre}){size} needs positive sizes')
        return AxisRef(name, pre, size)
    return AxisRef(name)


def _dim(r: ShardyReader) -> DimSharding:
    r.expect("{", "to open a dim sharding")
    axes: list[AxisRef] = []
    is_open = False
    if not r.try_literal("}"):
        while True:
            if r.try_literal("?"):
                is_open = True
                r.expect("}", "after '?' (an open dim ends with it)")
                break
            axes.append(_axis_ref(r))
            if r.try_literal("}"):
                break
            r.expect(",", "or '}' in a dim sharding")
    priority = None
    r.skip()
    if r.text.startswith("p", r.pos) and _INT.match(r.text, r.pos + 1):
        r.pos += 1
        priority = r.int("a priority")
    return DimSharding(tuple(axes), is_open, priority)


def _axis_set(r: ShardyReader) -> tuple[AxisRef, ...]:
    r.expect("=", "after replicated/unreduced")
    return _axis_list(r)


def _axis_list(r: ShardyReader) -> tuple[AxisRef, ...]:
    r.expect("{", "to open an axis set")
    return tuple(r.comma_list("}", lambda: _axis_ref(r), "an axis set"))


def _unreduced_axes(r: ShardyReader) -> tuple[str, tuple[AxisRef, ...]]:
    """`={...}`, `=max{...}` or `{...}`: Shardy's parser takes the `=` and the reduction as optional."""
    reduction = "sum"
    if r.try_literal("="):
        r.skip()
        for kind in REDUCTIONS:
            if r.text.startswith(kind, r.pos):
                r.pos += len(kind)
                reduction = kind
                break
    return reduction, _axis_list(r)


def _tensor_sharding(r: ShardyReader) -> TensorSharding:
    """`<@mesh, [{...}, ...], replicated={...}>`, the mesh by name or inline."""
    r.expect("<", "to open a tensor sharding")
    mesh: str | SdyMesh
    if r.try_literal("@"):
        mesh = r.match(_IDENT, "a mesh name").group(0)
    elif r.try_literal("mesh"):
        mesh = _mesh_body(r)
    else:
        raise r.fail("expected '@mesh_name' or an inline mesh<...>")
    r.expect(",", "after the mesh")
    r.expect("[", "to open the dim shardings")
    dims = r.comma_list("]", lambda: _dim(r), "the dim shardings")
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()
    reduction = "sum"
    while r.try_literal(","):
        key = r.match(re.compile(r"replicated|unreduced"), "replicated={...} or unreduced={...}").group(0)
        if key == "replicated":
            replicated = _axis_set(r)
        else:
            reduction, unreduced = _unreduced_axes(r)
    r.expect(">", "to close the tensor sharding")
    return TensorSharding(mesh, tuple(dims), replicated, unreduced, reduction)


def parse_meshes(text: str) -> dict[str, SdyMesh]:
    """`{mesh = #sdy.mesh<[...]>, other = #sdy.mesh<[...]>}` (the module's `xla.sdy.meshes`)."""
    r = ShardyReader(text)
    r.expect("{", "to open the meshes")

    def entry() -> tuple[str, SdyMesh]:
        name = r.match(_IDENT, "a mesh name").group(0)
        r.expect("=", f"after mesh name {name}")
        r.expect("#sdy.mesh", "(a mesh is written #sdy.mesh<...>)")
        return name, _mesh_body(r)

    entries = r.comma_list("}", entry, "the meshes")
    r.end()
    meshes: dict[str, SdyMesh] = {}
    for name, mesh in entries:
        if name in meshes:
            raise ShardyTextError(f"mesh {name} is defined twice", 0)
        meshes[name] = mesh
    return meshes


def parse_sharding(text: str) -> tuple[TensorSharding, ...]:
    """`#sdy.sharding<...>` (one value) or `#sdy.sharding_per_value<[<...>, ...]>` (one per result)."""
    r = ShardyReader(text)
    if r.try_literal("#sdy.sharding_per_value"):
        r.expect("<", "to open sharding_per_value")
        r.expect("[", "to open the per-value list")
        shardings = r.comma_list("]", lambda: _tensor_sharding(r), "the per-value list")
        r.expect(">", "to close sharding_per_value")
    elif r.try_literal("#sdy.sharding"):
        shardings = [_tensor_sharding(r)]
    else:
        raise r.fail("expected #sdy.sharding<...> or #sdy.sharding_per_value<[...]>")
    r.end()
    return tuple(shardings)


def parse_manual_axes(text: str) -> tuple[str, ...]:
    """`#sdy<manual_axes{"b", "c"}>` (`xla.sdy.manual_axes`) -> ("b", "c")."""
    r = ShardyReader(text)
    r.expect("#sdy<manual_axes", "to open the manual axes")
    r.expect("{", "to open the manual axes' list")
    names = r.comma_list("}", lambda: r.match(_QUOTED, "a quoted axis name").group(1), "the manual axes")
    r.expect(">", "to close the manual axes")
    r.end()
    return tuple(names)


def parse_group_id(text: str) -> int:
    """`0 : i64` (`xla.sdy.sharding_group_id`)."""
    r = ShardyReader(text)
    value = r.int("a sharding group id")
    if r.try_literal(":"):
        r.match(re.compile(r"i\d+"), "an integer type like i64")
    r.end()
    return value


# --- GSPMD equivalent --------------------------------------------------------------------------


def to_hlo_sharding(sharding: TensorSharding, meshes: dict[str, SdyMesh], rank: int) -> HloSharding:
    """The HloSharding that places data as `sharding` does (see the module docstring's example).

    Open dims and priorities only steer propagation; the data placement is the
    same, so they do not appear here (callers turn open dims into GSPMD's
    `unspecified_dims`). Unreduced axes have no HloSharding form.
    """
    mesh = _resolve(sharding.mesh, meshes)
    if len(sharding.dims) != rank:
        raise ValueError(f"sharding {sharding.to_text()} has {len(sharding.dims)} dims for a rank-{rank} value")
    if sharding.unreduced:
        raise ValueError(f"unreduced axes {[a.to_text() for a in sharding.unreduced]} have no GSPMD form")
    if mesh.is_maximal:
        return HloSharding.maximal(mesh.device_ids[0])
    factors = mesh_factors(mesh, [a for d in sharding.dims for a in d.axes] + list(sharding.replicated))
    used: list[int] = []
    tile_dims: list[int] = []
    for dim in sharding.dims:
        count = 1
        for ref in dim.axes:
            for index in factor_indices(factors, ref, mesh):
                if index in used:
                    raise ValueError(f"axis {ref.to_text()} is used twice in {sharding.to_text()}")
                used.append(index)
                count *= factors[index][2]
        tile_dims.append(count)
    rest = [i for i in range(len(factors)) if i not in used]
    replicated = math.prod(factors[i][2] for i in rest)
    if math.prod(tile_dims) == 1:
        return HloSharding.replicate()
    order = tuple(used + rest)
    sizes = tuple(f[2] for f in factors)
    dims = (*tile_dims, replicated) if replicated > 1 else tuple(tile_dims)
    if mesh.device_ids and list(mesh.device_ids) != list(range(mesh.num_devices)):
        import numpy as np

        devices = np.asarray(mesh.device_ids).reshape(sizes).transpose(order)
        tiles = TileAssignment.from_devices(devices, dims)
    else:
        tiles = TileAssignment.from_iota(dims, sizes, order)
    return HloSharding.partial_tile(tiles) if replicated > 1 else HloSharding.tile(tiles)


def _resolve(mesh: str | SdyMesh, meshes: dict[str, SdyMesh]) -> SdyMesh:
    if isinstance(mesh, SdyMesh):
        return mesh
    if mesh not in meshes:
        known = ", ".join(meshes) or "none"
        raise ValueError(f"mesh @{mesh} is not among the module's meshes ({known})")
    return meshes[mesh]


def mesh_factors(mesh: SdyMesh, refs: list[AxisRef]) -> list[tuple[str, int, int]]:
    """Every axis cut at the sub-axis boundaries `refs` use: (axis, pre-size, size), major to minor."""
    cuts: dict[str, set[int]] = {name: {1, size} for name, size in mesh.axes}
    for ref in refs:
        if ref.name not in cuts:
            raise ValueError(f'axis "{ref.name}" is not in mesh {mesh.to_text()}')
        if ref.pre_size is not None and ref.size is not None:
            total = mesh.size_of(ref.name)
            end = ref.pre_size * ref.size
            if total % end:
                raise ValueError(f"sub-axis {ref.to_text()} does not divide axis size {total}")
            cuts[ref.name] |= {ref.pre_size, end}
    factors: list[tuple[str, int, int]] = []
    for name, _ in mesh.axes:
        bounds = sorted(cuts[name])
        factors.extend((name, lo, hi // lo) for lo, hi in itertools.pairwise(bounds))
    return factors


def factor_indices(factors: list[tuple[str, int, int]], ref: AxisRef, mesh: SdyMesh) -> list[int]:
    if ref.pre_size is None or ref.size is None:
        return [i for i, f in enumerate(factors) if f[0] == ref.name]
    end = ref.pre_size * ref.size
    return [i for i, (name, pre, _) in enumerate(factors) if name == ref.name and ref.pre_size <= pre < end]


def replica_groups_over(mesh: SdyMesh, refs: list[AxisRef]) -> tuple[tuple[int, ...], ...]:
    """A collective's device groups over mesh axes `refs`: one group per setting of the other axes, each
    holding the devices that differ along `refs`, in the order named. Example: over mesh
    ["fsdp"=2, "tp"=4], ["tp"] is ((0,1,2,3), (4,5,6,7)) and ["fsdp"] is ((0,4), (1,5), (2,6), (3,7))."""
    import numpy as np

    factors = mesh_factors(mesh, refs)
    grouped = [i for ref in refs for i in factor_indices(factors, ref, mesh)]
    rest = [i for i in range(len(factors)) if i not in grouped]
    devices = np.asarray(mesh.device_ids or range(mesh.num_devices)).reshape([f[2] for f in factors] or [1])
    size = math.prod(factors[i][2] for i in grouped)
    rows = devices.transpose(rest + grouped).reshape(-1, size)
    return tuple(tuple(int(d) for d in row) for row in rows)


def parse_mesh(text: str) -> SdyMesh:
    """`<["a"=2, "b"=4], device_ids=[...]>`, a mesh as `sdy.mesh @name = ...` declares it in MLIR."""
    r = ShardyReader(text)
    mesh = _mesh_body(r)
    r.end()
    return mesh
