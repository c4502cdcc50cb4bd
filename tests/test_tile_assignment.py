"""Tile assignments: iota expansion, transpose and reshape against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.sharding import HloSharding, TileAssignment, parse_sharding


def test_iota_expands_as_documented() -> None:
    tiles = TileAssignment.from_iota((2, 4), (4, 2), (1, 0))
    assert tiles.array().tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert tiles.to_text() == "devices=[2,4]<=[4,2]T(1,0)"


def test_explicit_list_equals_iota_with_same_devices() -> None:
    a = parse_sharding("{devices=[4,2]0,1,2,3,4,5,6,7}")
    b = parse_sharding("{devices=[4,2]<=[8]}")
    assert a == b and hash(a) == hash(b)
    assert a.to_text() != b.to_text()  # the written form is kept


def test_metadata_is_ignored_but_shard_groups_count() -> None:
    plain = parse_sharding("{devices=[2,2]<=[4]}")
    assert parse_sharding('{devices=[2,2]<=[4] metadata={op_name="a"}}') == plain
    assert parse_sharding("{devices=[2,2]<=[4] shard_as 1}") != plain
    assert parse_sharding("{unknown shard_as 1}") != parse_sharding("{unknown shard_as 2}")


def test_partial_tile_spanning_all_devices_is_replicated() -> None:
    assert parse_sharding("{devices=[1,1,8]<=[8] last_tile_dim_replicate}") == HloSharding.replicate()


def _factorisations(n: int) -> st.SearchStrategy[list[int]]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]

    @st.composite
    def build(draw: st.DrawFn) -> list[int]:
        out, left = [], n
        while left > 1:
            d = draw(st.sampled_from([d for d in divisors if left % d == 0 and d > 1]))
            out.append(d)
            left //= d
        if draw(st.booleans()):
            out.insert(draw(st.integers(0, len(out))), 1)
        return out or [1]

    return build()


@st.composite
def iota_and_perm(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int]]:
    n = draw(st.sampled_from([4, 8, 12, 16, 24, 32]))
    reshape = draw(_factorisations(n))
    perm = draw(st.permutations(range(len(reshape))))
    dims = draw(_factorisations(n))
    tile_perm = draw(st.permutations(range(len(dims))))
    return reshape, list(perm), dims, list(tile_perm)


@settings(max_examples=400, deadline=None)
@given(iota_and_perm())
def test_transpose_and_reshape_agree_with_numpy(case: tuple[list[int], list[int], list[int], list[int]]) -> None:
    reshape, perm, dims, tile_perm = case
    n = math.prod(reshape)
    reference = np.arange(n).reshape(reshape).transpose(perm).reshape(dims)
    tiles = TileAssignment.from_iota(tuple(dims), tuple(reshape), tuple(perm))
    assert (tiles.array() == reference).all()
    moved = tiles.transpose(tuple(tile_perm))
    assert (moved.array() == reference.transpose(tile_perm)).all()
    flat = moved.reshape((n,))
    assert flat.flat_devices == tuple(reference.transpose(tile_perm).reshape(-1).tolist())


@pytest.mark.parametrize(
    "text,shape,shard",
    [
        ("{devices=[4,1,2]<=[8]}", (8, 32, 1024), (2, 32, 512)),
        ("{devices=[1,2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", (8, 1024, 4096), (8, 512, 4096)),
        ("{devices=[4]<=[4]}", (10,), (3,)),  # ceil: the last tile is padded
        ("{replicated}", (8, 8), (8, 8)),
        ("{maximal device=3}", (8, 8), (8, 8)),
    ],
)
def test_shard_shape(text: str, shape: tuple[int, ...], shard: tuple[int, ...]) -> None:
    assert parse_sharding(text).shard_shape(shape) == shard


@pytest.mark.parametrize(
    "written,short",
    [
        ("{devices=[4,2]0,1,2,3,4,5,6,7}", "{devices=[4,2]<=[8]}"),
        ("{devices=[2,4]0,2,4,6,1,3,5,7}", "{devices=[2,4]<=[4,2]T(1,0)}"),
        ("{devices=[1,2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}",
         "{devices=[1,2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}"),
        ("{devices=[64,4]" + ",".join(str(d) for d in np.arange(256).reshape(4, 64).T.reshape(-1)) + "}",
         "{devices=[64,4]<=[4,64]T(1,0)}"),
        ("{{replicated}, {devices=[2,2]0,1,2,3}}", "{{replicated}, {devices=[2,2]<=[4]}}"),
        ("{devices=[2,2]0,3,1,2}", "{devices=[2,2]0,3,1,2}"),  # no iota gives these devices: kept as listed
        ("{devices=[2,2]<=[4] shard_as 3}", "{devices=[2,2]<=[4] shard_as 3}"),
        ("{maximal device=1}", "{maximal device=1}"),
    ],
    ids=["iota", "transposed", "partial", "fsdp64_tp4", "tuple", "not_an_iota", "shard_group", "maximal"],
)  # fmt: skip
def test_short_text_is_xla_s_iota_form_of_the_same_sharding(written: str, short: str) -> None:
    sharding = parse_sharding(written)
    assert sharding.to_short_text() == short
    assert parse_sharding(short) == sharding
    assert sharding.to_text() == written  # printing a module keeps the written form


@settings(max_examples=300, deadline=None)
@given(iota_and_perm())
def test_every_iota_written_out_is_found_again(case: tuple[list[int], list[int], list[int], list[int]]) -> None:
    reshape, perm, dims, _ = case
    iota = TileAssignment.from_iota(tuple(dims), tuple(reshape), tuple(perm))
    listed = TileAssignment.from_devices(iota.array())
    assert listed.iota is None and listed.as_iota().iota == iota.iota and listed.as_iota() == listed
