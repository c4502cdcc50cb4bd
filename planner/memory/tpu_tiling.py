"""XLA:TPU's tiled layouts: what an array occupies once its two minor dims are padded to whole tiles.

XLA:TPU lays a rank-2 or higher array out in tiles over its two most minor dims: 8 x 128 elements for 32- and
16-bit types (`bf16[128256,512]{1,0:T(8,128)(2,1)}` in its buffer assignment: 16-bit elements are then packed in
pairs inside the tile), 32 x 128 for 8-bit ones (`s8[...]{...:T(32,128)(4,1)}`). An allocation holds the minor
dim rounded up to 128 and the second most minor to the tile's rows; a dim of fewer rows than the tile takes a
tile of its own height (`s8[1,4,4]{2,1,0:T(4,128)(4,1)}`), unpadded. Every table measured has a multiple of 16
rows, so the 8 rows of a 16-bit tile are read from the layout, not from a padded allocation.

Worked example, from the thread-local tables of MaxText's Gemma 3 4B step on v6e-8: the embedding's shard
bf16[262144,320] holds 262,144 x 384 x 2 = 201,326,592 bytes (192 MiB), not 160 MiB; its gathered rows
bf16[16384,320] 12 MiB, not 10.

Which dims are minor is XLA's layout assignment's choice and is not in the module a plan reads; the model pads
only where the layout is known: the row-major tables and rows of SparseCore's gathers (`sparse_core`).
"""

from __future__ import annotations

import math

from planner.hlo.ir.shapes import ELEMENT_BITS

TILE_MINOR = 128
# The tile's rows by element width in bits; other widths are not measured and take 8.
TILE_ROWS = {32: 8, 16: 8, 8: 32}


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def tiled_dims(element_type: str, dims: tuple[int, ...]) -> tuple[int, ...]:
    """`dims` (row-major) with the minor dim padded to 128 and the second most minor to the tile's rows; rank 0
    and 1 as they are."""
    if len(dims) < 2:
        return tuple(dims)
    rows = TILE_ROWS.get(ELEMENT_BITS[element_type], 8)
    second_minor = dims[-2] if dims[-2] < rows else _round_up(dims[-2], rows)
    return (*dims[:-2], second_minor, _round_up(dims[-1], TILE_MINOR))


def tiled_bytes(element_type: str, dims: tuple[int, ...]) -> int:
    """Bytes of a row-major array of `dims` in XLA:TPU's tiled layout."""
    return math.prod(tiled_dims(element_type, dims)) * ELEMENT_BITS[element_type] // 8
