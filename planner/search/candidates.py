"""The configurations a search tries: mesh factorizations of the chip count x remat x microbatches x chip.

A candidate is plain data, so it travels to a Ray worker as it is; the step builder reads its fields
(`remat`, `microbatches`) and the search builds the mesh from `axes` on whatever devices the worker has.
Worked example: 8 devices over axes ("fsdp", "tp") factor as (1, 8), (2, 4), (4, 2), (8, 1); with remat
(None, "full") and chip v6e that is 8 candidates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One configuration: mesh axis sizes (major to minor), remat policy, microbatches, chip preset."""

    axes: tuple[tuple[str, int], ...]
    remat: str | None
    microbatches: int
    chip: str

    def __post_init__(self) -> None:
        if not self.axes or any(size < 1 for _, size in self.axes):
            raise ValueError(f"mesh axes={self.axes} must name at least one axis, each of size >= 1")
        if self.microbatches < 1:
            raise ValueError(f"microbatches={self.microbatches} must be >= 1")

    @property
    def num_devices(self) -> int:
        return math.prod(size for _, size in self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    def label(self) -> str:
        mesh = ",".join(f"{name}={size}" for name, size in self.axes)
        return f"{mesh} remat={self.remat or 'none'} microbatches={self.microbatches} {self.chip}"


def factorizations(num_devices: int, num_axes: int) -> list[tuple[int, ...]]:
    """Every way to write `num_devices` as an ordered product of `num_axes` positive sizes."""
    if num_devices < 1 or num_axes < 1:
        raise ValueError(f"cannot factor {num_devices} devices over {num_axes} axes")
    divisors = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
    return [f for f in itertools.product(divisors, repeat=num_axes) if math.prod(f) == num_devices]


def remat_policies(names: Sequence[str]) -> list[str | None]:
    """Remat policies as a user names them: `none` is no remat."""
    return [None if name == "none" else name for name in names]


def candidate_grid(
    num_devices: int,
    axis_names: Sequence[str],
    remats: Sequence[str | None] = (None,),
    microbatches: Sequence[int] = (1,),
    chips: Sequence[str] = ("v6e",),
) -> list[Candidate]:
    """The product of the mesh factorizations and the other choices, in a stable order."""
    return [
        Candidate(tuple(zip(axis_names, shape)), remat, k, chip)
        for shape in factorizations(num_devices, len(axis_names))
        for remat in remats
        for k in microbatches
        for chip in chips
    ]
