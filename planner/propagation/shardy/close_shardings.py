"""Shardy's `sdy-close-shardings`: after propagation every dim is closed and replicated axes are dropped,
unreduced ones kept (`TensorShardingAttr::getClosedLike`): `[{"a", ?}, {?}], replicated={"b"}` becomes
`[{"a"}, {}]`."""

from __future__ import annotations

from dataclasses import replace

from planner.propagation.shardy.program import Program
from planner.sharding.shardy import TensorSharding


def close_shardings(program: Program) -> None:
    def close(s: TensorSharding) -> TensorSharding:
        return replace(s, dims=tuple(replace(d, is_open=False) for d in s.dims), replicated=())

    program.map_shardings(close)
