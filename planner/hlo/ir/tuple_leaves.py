"""Where each top-level element of a tuple shape starts among its leaves.

Propagation (tuple shardings hold one sharding per leaf) and the memory model (one value per leaf)
both index a loop's 100-element state by element many times per run: the offsets are computed
once per shape object.
"""

from __future__ import annotations

from planner.hlo.ir.shapes import Shape, TupleShape


def leaf_count(shape: Shape) -> int:
    return leaf_offsets(shape)[-1] if isinstance(shape, TupleShape) else 1


# id(shape) -> (shape, offsets). Keyed by identity: hashing a 100-element tuple
# shape structurally on every lookup costs more than the lookup saves.
_OFFSETS: dict[int, tuple[TupleShape, tuple[int, ...]]] = {}


def leaf_offsets(shape: TupleShape) -> tuple[int, ...]:
    """Leaf offset of each top-level element, then the total leaf count."""
    cached = _OFFSETS.get(id(shape))
    if cached is not None and cached[0] is shape:
        return cached[1]
    offsets = [0]
    for element in shape.elements:
        offsets.append(offsets[-1] + leaf_count(element))
    if len(_OFFSETS) > 65536:
        _OFFSETS.clear()
    _OFFSETS[id(shape)] = (shape, tuple(offsets))
    return tuple(offsets)
