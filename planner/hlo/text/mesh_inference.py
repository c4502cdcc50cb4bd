"""The mesh a Shardy module names but does not declare, found from the GSPMD shardings written beside its own.

jax 0.12's `lowered.as_text(dialect="hlo")` keeps each Shardy sharding in
`frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, ...>"}` but drops the module's
`xla.sdy.meshes`, so `@mesh` is named and never defined. JAX writes the GSPMD form of the same
sharding beside it on every annotated instruction (`sharding={devices=[2,1,1,4]<=[8]
last_tile_dim_replicate}` beside `[{"fsdp"}, {}, {}]`), and that pins the mesh down: the mesh is
the one order and sizing of the axes the Shardy shardings use, over `num_partitions` devices,
under which every Shardy sharding converts to the GSPMD one written beside it.

Example: 8 partitions, axes fsdp and tp used. `[{"fsdp"}, {}, {}]` beside `{devices=[2,1,1,4]<=[8]
last_tile_dim_replicate}` leaves fsdp=2 major (tp=4 then fills the rest), and `[{}, {"tp"},
{"fsdp"}]` beside `{devices=[1,4,2]<=[2,4]T(1,0)}` agrees: the mesh is ["fsdp"=2, "tp"=4].
A mesh that is not the only one to fit is not guessed: None, and the caller asks for `--mesh`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.shardy import SdyMesh, TensorSharding, to_hlo_sharding

# Pairs checked per candidate mesh: enough to tell the candidates apart, few enough to stay fast.
_MAX_PAIRS = 64


def named_meshes(module: HloModule) -> set[str]:
    """The mesh names the module's Shardy shardings refer to (`@mesh`)."""
    names: set[str] = set()
    for sharding, _, _ in _pairs(module, with_gspmd=False):
        if isinstance(sharding.mesh, str):
            names.add(sharding.mesh)
    return names


def infer_mesh(module: HloModule, num_devices: int) -> SdyMesh | None:
    """The one mesh over `num_devices` under which every Shardy sharding is the GSPMD one beside it, else None."""
    pairs = list(itertools.islice(_pairs(module, with_gspmd=True), _MAX_PAIRS))
    axes = _axis_names(module)
    if not pairs or not axes or num_devices < 1:
        return None
    # Meshes that differ only in where their size-1 axes stand place every value alike: one is kept.
    fitting: dict[tuple[tuple[str, int], ...], SdyMesh] = {}
    for order in itertools.permutations(axes):
        for sizes in _factorizations(num_devices, len(order)):
            mesh = SdyMesh(tuple(zip(order, sizes)))
            if all(_converts_to(s, mesh, rank, gspmd) for s, rank, gspmd in pairs):
                fitting.setdefault(tuple(a for a in mesh.axes if a[1] > 1), mesh)
                if len(fitting) > 1:
                    return None
    return next(iter(fitting.values()), None)


def _converts_to(sharding: TensorSharding, mesh: SdyMesh, rank: int, gspmd: HloSharding | None) -> bool:
    try:
        converted = to_hlo_sharding(TensorSharding(mesh, sharding.dims, sharding.replicated), {}, rank)
    except ValueError:
        return False
    return gspmd is not None and converted == gspmd.with_metadata(())


def _axis_names(module: HloModule) -> tuple[str, ...]:
    """Every axis the Shardy shardings name, in order of first use."""
    seen: dict[str, None] = {}
    for sharding, _, _ in _pairs(module, with_gspmd=False):
        for dim in sharding.dims:
            for ref in dim.axes:
                seen.setdefault(ref.name)
        for ref in (*sharding.replicated, *sharding.unreduced):
            seen.setdefault(ref.name)
    return tuple(seen)


def _pairs(module: HloModule, with_gspmd: bool) -> Iterator[tuple[TensorSharding, int, HloSharding | None]]:
    """(Shardy sharding, rank, GSPMD sharding written beside it) of each single-result annotated array."""
    for comp in module.computations:
        for inst in comp.instructions:
            attrs = inst.attr("frontend_attributes")
            if not isinstance(attrs, FrontendAttributes) or not attrs.sdy_sharding or len(attrs.sdy_sharding) != 1:
                continue
            gspmd = inst.sharding
            if with_gspmd and (gspmd is None or gspmd.is_tuple or not isinstance(inst.shape, ArrayShape)):
                continue
            rank = inst.shape.rank if isinstance(inst.shape, ArrayShape) else 0
            yield attrs.sdy_sharding[0], rank, gspmd


def _factorizations(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every way to write n as an ordered product of k factors, each at least 1."""
    if k == 1:
        yield (n,)
        return
    for first in range(1, n + 1):
        if n % first == 0:
            for rest in _factorizations(n // first, k - 1):
                yield (first, *rest)


__all__ = ["infer_mesh", "named_meshes"]
