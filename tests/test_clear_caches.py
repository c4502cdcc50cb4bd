"""`planner.clear_caches` forgets everything the engine memoises, each package clearing its own.

Benchmarks run cold through it. The check finds every memoised function at module level in the engine (a
`functools` cache has `cache_info`), fills them by planning the bundled dump, and asks that none keeps an
entry after the call. The planner's version, read once from the installed package, is a constant.
"""

from __future__ import annotations

import importlib
import pkgutil

import planner
from planner.data import DEFAULT_DUMP
from planner.passes import Planning, Preparation

CONSTANTS = {"planner.version.planner_version"}


def _memoised() -> dict[str, object]:
    found = {}
    for info in pkgutil.walk_packages(planner.__path__, "planner."):
        if info.name == "planner.__main__":  # runs the command line when imported
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if callable(getattr(value, "cache_info", None)) and getattr(value, "__module__", None) == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def test_clear_caches_empties_every_memoised_function_of_the_engine() -> None:
    memoised = _memoised()
    prepared = Preparation("v6e").apply(planner.parse_hlo_file(DEFAULT_DUMP))
    Planning(32 << 30).apply(prepared)
    filled = {name for name, f in memoised.items() if f.cache_info().currsize}  # type: ignore[attr-defined]
    # Planning fills caches of the algebra, the parser's checks and the memory model.
    assert {n.rsplit(".", 2)[0] for n in filled} >= {"planner.sharding", "planner.hlo.text", "planner.memory"}
    planner.clear_caches()
    kept = {name for name, f in memoised.items() if f.cache_info().currsize} - CONSTANTS  # type: ignore[attr-defined]
    assert not kept
