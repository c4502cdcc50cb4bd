"""XLA:TPU's tiled layouts: what an array occupies once its two minor dims are padded to whole tiles.

XLA:TPU lays a rank-2 or higher array out in tiles of 8 x 128 elements over its two most minor dims
(`{1,0:T(8,128)(2,1)}` in its dumps: 16-bit elements are then packed in pairs inside the tile), so an
allocation holds the minor dim rounded up to 128 and the second most minor to 8. Worked example, from the
thread-local tables of MaxText's Gemma 3 4B step on v6e-8: the embedding's shard bf16[262144,320] holds
262,144 x 384 x 2 = 201,326,592 bytes (192 MiB), not 160 MiB; its gathered rows bf16[16384,320] 12 MiB, not 10.

Which dims are minor is XLA's layout assignment's choice and is not in the module a plan reads; the model pads
only where the layout is known: the row-major tables and rows of SparseCore's gathers (`sparse_core`).
"""

from __future__ import annotations

import math

from planner.hlo.ir.shapes import ELEMENT_BITS

TILE_MINOR = 128
TILE_SECOND_MINOR = 8


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def tiled_dims(dims: tuple[int, ...]) -> tuple[int, ...]:
    """`dims` (row-major) with the minor dim padded to 128 and the second most minor to 8; rank 0 and 1 as they
    are."""
    if len(dims) < 2:
        return tuple(dims)
    return (*dims[:-2], _round_up(dims[-2], TILE_SECOND_MINOR), _round_up(dims[-1], TILE_MINOR))


def tiled_bytes(element_type: str, dims: tuple[int, ...]) -> int:
    """Bytes of a row-major array of `dims` in XLA:TPU's 8 x 128 tiled layout."""
    return math.prod(tiled_dims(dims)) * ELEMENT_BITS[element_type] // 8
