"""The passes around propagation that change shardings: Shardy's import before, its export after.

`sdy-propagation-pipeline`, which XLA runs, is import -> user-priority propagation -> export. Each pass
is a module of the name Shardy gives it; these are the ones that change what propagation starts from
(import) and what the partitioner reads (export), in Shardy's order. Sharding groups are unified
(`sharding_group_import`) as propagation starts, where every pass reads them.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.propagation.shardy.apply_sharding_constraints import apply_sharding_constraints
from planner.propagation.shardy.close_shardings import close_shardings
from planner.propagation.shardy.constant_splitting import split_constants
from planner.propagation.shardy.manual_axes_cleanup import manual_axes_cleanup
from planner.propagation.shardy.program import Program
from planner.propagation.shardy.propagate_to_func_results import propagate_to_func_results
from planner.propagation.shardy.remove_size_one_axes import remove_size_one_axes
from planner.propagation.shardy.update_non_divisible_io import update_non_divisible_io

Pass = Callable[[Program], None]

# Shardy's name for each pass, in the order its pipeline runs them (`import_pipeline.cc`, then the
# propagation pipeline's own `sdy-apply-sharding-constraints`; after propagation the pipeline's own
# `sdy-propagate-to-func-results`, then `export_pipeline.cc`).
IMPORT_PASSES: tuple[tuple[str, Pass], ...] = (
    ("sdy-remove-size-one-axes", remove_size_one_axes),
    ("sdy-constant-or-scalar-splitter", split_constants),
    ("sdy-manual-axes-cleanup", manual_axes_cleanup),
    ("sdy-apply-sharding-constraints", apply_sharding_constraints),
)
EXPORT_PASSES: tuple[tuple[str, Pass], ...] = (
    ("sdy-propagate-to-func-results", propagate_to_func_results),
    ("sdy-update-non-divisible-input-output-shardings", update_non_divisible_io),
    ("sdy-close-shardings", close_shardings),
)


def run_import(program: Program) -> None:
    for _, run in IMPORT_PASSES:
        run(program)


def run_export(program: Program) -> None:
    for _, run in EXPORT_PASSES:
        run(program)


__all__ = ["EXPORT_PASSES", "IMPORT_PASSES", "run_export", "run_import"]
