"""Shardy's `sdy-propagate-to-func-results`: after propagation, a function's results take the shardings of
the values its terminator returns.

Called functions are linked to their calls by the program (named computations and shared callees), so
what is left is the main function, which releases treat apart: jaxlib 0.12's pass writes a main result
that has no sharding from the returned value (`return %c` of `%c = sharding_constraint %x <@mesh, [{}, {}]>`
leaves `-> (tensor<8x8xf32> {sdy.sharding = <@mesh, [{}, {}]>})`) and keeps one that has a sharding; jaxlib
0.7.1 writes none (`ShardyRelease.pipeline`). What the result holds is what the returned value holds, so
only the written out-sharding changes, never the bytes.
"""

from __future__ import annotations

from planner.propagation.shardy.program import Program


def propagate_to_func_results(program: Program) -> None:
    if not program.release.pipeline.main_results_from_terminator:
        return
    for result in program.results:
        if result.sharding is None and result.value.sharding is not None:
            result.sharding = result.value.sharding
