"""Axis references as Shardy compares, splits and merges them.

A reference is a whole mesh axis (`"x"`) or a sub-axis `"x":(pre)size`: the factor of size `size`
whose more-major factors multiply to `pre`. On a mesh with `"x"=8`, `"x":(1)2`, `"x":(2)2` and
`"x":(4)2` are its three factors of 2, major to minor, and `"x":(2)4` covers the last two. Two
references overlap when they share a device-grouping factor of the same axis; one is a prefix of the
other when it starts at the same pre-size and is contained in it (`"x":(1)2` is a prefix of `"x"`).
These are the relations `AxisRefAttr` defines in Shardy's dialect; propagation is built on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.sharding.shardy import AxisRef, SdyMesh


def axis(name: str, pre_size: int = 1, size: int | None = None, mesh: SdyMesh | None = None) -> AxisRef:
    """A reference, written as the whole axis when it covers all of it."""
    if size is None or (pre_size == 1 and mesh is not None and mesh.size_of(name) == size):
        return AxisRef(name)
    return AxisRef(name, pre_size, size)


def size_of(ref: AxisRef, mesh: SdyMesh) -> int:
    return ref.size if ref.size is not None else mesh.size_of(ref.name)


def pre_size(ref: AxisRef) -> int:
    return ref.pre_size if ref.pre_size is not None else 1


def next_pre_size(ref: AxisRef, mesh: SdyMesh) -> int:
    """The pre-size of whatever follows this reference within its axis (the axis size for a whole axis)."""
    if ref.pre_size is None or ref.size is None:
        return mesh.size_of(ref.name)
    return ref.pre_size * ref.size


def total_size(refs: Sequence[AxisRef], mesh: SdyMesh) -> int:
    return math.prod(size_of(r, mesh) for r in refs)


def contains(outer: AxisRef, inner: AxisRef) -> bool:
    if outer.name != inner.name:
        return False
    if outer.pre_size is None:
        return True
    if inner.pre_size is None:
        return False
    assert outer.size is not None and inner.size is not None
    return outer.pre_size <= inner.pre_size and outer.pre_size * outer.size >= inner.pre_size * inner.size


def prefix_of(first: AxisRef, second: AxisRef) -> bool:
    return contains(second, first) and pre_size(first) == pre_size(second)


def strict_prefix_of(first: AxisRef, second: AxisRef) -> bool:
    return first != second and prefix_of(first, second)


def overlaps(a: AxisRef, b: AxisRef) -> bool:
    if a.name != b.name:
        return False
    if a.pre_size is None or b.pre_size is None:
        return True
    assert a.size is not None and b.size is not None
    return a.pre_size < b.pre_size * b.size and b.pre_size < a.pre_size * a.size


def _sub_axes_coexist(min_pre: int, max_pre: int, min_next: int, max_next: int) -> bool:
    if min_next > max_pre:
        # Overlapping: the overlap and both remainders must be whole factors.
        return min_next % max_pre == 0 and max_pre % min_pre == 0 and max_next % min_next == 0
    return max_pre % min_next == 0


def can_coexist(a: AxisRef, b: AxisRef) -> bool:
    """Whether both can be factors of one decomposition of their axis."""
    if a.name != b.name or a.pre_size is None or b.pre_size is None:
        return True
    assert a.size is not None and b.size is not None
    pres = sorted((a.pre_size, b.pre_size))
    nexts = sorted((a.pre_size * a.size, b.pre_size * b.size))
    return _sub_axes_coexist(pres[0], pres[1], nexts[0], nexts[1])


def prefix_without_overlap(ref: AxisRef, other: AxisRef) -> AxisRef | None:
    """The largest prefix of `ref` that does not overlap `other` (None: nothing is left)."""
    if not can_coexist(ref, other):
        return None
    if not overlaps(ref, other):
        return ref
    this_pre, other_pre = pre_size(ref), pre_size(other)
    if this_pre >= other_pre:
        return None
    return AxisRef(ref.name, this_pre, other_pre // this_pre)


def prefix_without_overlap_all(ref: AxisRef, others: Sequence[AxisRef]) -> AxisRef | None:
    result: AxisRef | None = ref
    for other in others:
        if result is None:
            return None
        result = prefix_without_overlap(result, other)
    return result


def greatest_common_prefix(a: AxisRef, b: AxisRef) -> AxisRef | None:
    if not can_coexist(a, b):
        return None
    if prefix_of(a, b):
        return a
    if prefix_of(b, a):
        return b
    return None


def can_merge(a: AxisRef, b: AxisRef) -> bool:
    """`"x":(1)2` then `"x":(2)2`: consecutive sub-axes of one axis."""
    if a.name != b.name or a.pre_size is None or b.pre_size is None:
        return False
    assert a.size is not None
    return a.pre_size * a.size == b.pre_size


def merge(a: AxisRef, b: AxisRef, mesh: SdyMesh) -> AxisRef:
    assert can_merge(a, b) and a.size is not None and b.size is not None and a.pre_size is not None
    return axis(a.name, a.pre_size, a.size * b.size, mesh)


def add_axis_or_merge(axes: list[AxisRef], ref: AxisRef, mesh: SdyMesh) -> None:
    """Appends `ref`, merged into the last axis when they are consecutive sub-axes."""
    if axes and can_merge(axes[-1], ref):
        axes[-1] = merge(axes[-1], ref, mesh)
    else:
        axes.append(ref)


def list_prefix_status(first: Sequence[AxisRef], second: Sequence[AxisRef]) -> int:
    """EQUAL (0), STRICT_PREFIX (1) or NOT_A_PREFIX (2): `first` against `second`, as `isAxisListPrefixOf`."""
    if not first and not second:
        return EQUAL
    if not first:
        return STRICT_PREFIX
    if len(first) > len(second):
        return NOT_A_PREFIX
    for a, b in zip(first[:-1], second[: len(first) - 1], strict=True):
        if a != b:
            return NOT_A_PREFIX
    last, other = first[-1], second[len(first) - 1]
    if len(first) == len(second) and last == other:
        return EQUAL
    if prefix_of(last, other):
        return STRICT_PREFIX
    return NOT_A_PREFIX


EQUAL, STRICT_PREFIX, NOT_A_PREFIX = 0, 1, 2


def is_strict_prefix(first: Sequence[AxisRef], second: Sequence[AxisRef]) -> bool:
    return list_prefix_status(first, second) == STRICT_PREFIX


def greatest_common_prefix_list(a: Sequence[AxisRef], b: Sequence[AxisRef]) -> list[AxisRef]:
    """The longest list both start with; a shorter last sub-axis common to both counts."""
    out: list[AxisRef] = []
    for x, y in zip(a, b, strict=False):
        if x == y:
            out.append(x)
            continue
        common = greatest_common_prefix(x, y)
        if common is not None:
            out.append(common)
        break
    return out
