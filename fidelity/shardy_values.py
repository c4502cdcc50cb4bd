"""Shardy's shardings after propagation, printed as Shardy prints them, keyed like its lit tests (the lit
runner's view of the engine's program).

`@arg:N` is the function's argument N, `@result:N` its result N (`#sdy.sharding<...>`); an op is keyed
by its location (the `op_name` its instruction keeps) and prints `#sdy.sharding_per_value<[...]>` over
its results, an unsharded result of a sharded op as fully open. A loop's or branch's results are
printed on the op only once the edges are sunk into it (`sdy-sink-data-flow-edges`, the export);
before that they belong to the edges.
"""

from __future__ import annotations

from planner.hlo.ir.module import Instruction
from planner.propagation.shardy.program import BARRIER, CONSTRAINT, EDGE, RULE, Program, Value
from planner.sharding.shardy import DimSharding, TensorSharding


def sharding_text(sharding: TensorSharding) -> str:
    return "#sdy.sharding" + sharding.to_text()


def _empty(mesh: object, rank: int, closed: bool) -> TensorSharding:
    return TensorSharding(mesh, tuple(DimSharding((), is_open=not closed) for _ in range(rank)))  # type: ignore[arg-type]


def per_value_text(values: list[Value], closed: bool = False) -> str | None:
    """`closed`: after the export, which closes every dim, an unsharded result of a sharded op too."""
    sharded = [v.sharding for v in values if v.sharding is not None]
    if not sharded:
        return None
    mesh = sharded[0].mesh
    # A token prints as a rank-0 sharding on the op's mesh.
    parts = [(v.sharding or _empty(mesh, len(v.dims or ()), closed)).to_text() for v in values]
    return "#sdy.sharding_per_value<[" + ", ".join(parts) + "]>"


def _per_value(shardings: list[TensorSharding]) -> str:
    return "#sdy.sharding_per_value<[" + ", ".join(s.to_text() for s in shardings) + "]>"


def expectations(program: Program, edges_sunk: bool, constraints_as_reshards: bool = False) -> dict[str, str]:
    """`constraints_as_reshards`: after the export a constraint is an `sdy.reshard`, printed with its sharding."""
    out: dict[str, str] = {}
    for i, value in enumerate(program.args):
        if value.sharding is not None:
            out[f"@arg:{i}"] = sharding_text(value.sharding)
    for i, result in enumerate(program.results):
        if result.sharding is not None:
            out[f"@result:{i}"] = sharding_text(result.sharding)
    # The splitter's copies of one constant share its location, and Shardy prints them in the order of the
    # uses they serve: the first one printed with a sharding is the one the location names.
    split = set(program.split_from) | {original.index for original in program.split_from.values()}
    for op in program.ops:
        if op.kind is RULE and any(r.index in split for r in op.results) and op.loc in out:
            continue
        if op.kind in (RULE, BARRIER):
            is_constraint = op.is_sharding_constraint
            # A constraint (and the reshard the export makes of it) prints its one sharding.
            # An op the converter wrote as several instructions is its last one (the others prepare operands).
            if is_constraint and op.results[0].sharding is not None:
                out[op.loc] = sharding_text(op.results[0].sharding)
                continue
            if op.as_written is not None:
                out[op.loc] = _per_value(list(op.as_written))
                continue
            text = per_value_text(op.results, closed=constraints_as_reshards)
            if text is not None:
                out[op.loc] = text
    for op in program.ops:
        # A constraint the import adds (an open one per member of a sharding group written with different
        # shardings) is printed at the location Shardy gives it, where no op of the module's own is.
        if op.kind is CONSTRAINT and op.results[0].sharding is not None:
            out.setdefault(op.loc, sharding_text(op.results[0].sharding))
    for manual in program.manual:
        # Until the edges are sunk, the edges hold what propagation found and the op keeps what was written.
        ins = manual.current_in_shardings() if edges_sunk else manual.in_shardings
        outs = manual.current_out_shardings() if edges_sunk else manual.out_shardings
        out[f"{manual.loc}:in_shardings"] = _per_value(ins)
        out[f"{manual.loc}:out_shardings"] = _per_value(outs)
    if not edges_sunk:
        # Until the edges sink, a named computation keeps the in_shardings and out_shardings it was written with.
        for loc, written in program.named_written.items():
            for key, shardings in zip((f"{loc}:in_shardings", f"{loc}:out_shardings"), written, strict=True):
                if shardings and all(s is not None for s in shardings):
                    out[key] = _per_value(list(shardings))  # type: ignore[arg-type]
    if edges_sunk:
        # A named computation's edges sink into its `in_shardings` (block arguments) and `out_shardings`.
        for loc, (block_args, results) in program.named.items():
            for key, values in ((f"{loc}:in_shardings", block_args), (f"{loc}:out_shardings", results)):
                text = per_value_text(values, closed=constraints_as_reshards)
                if text is not None:
                    out[key] = text
        for loc, values in program.edge_results.items():
            if loc in program.named:
                continue
            text = per_value_text(values, closed=constraints_as_reshards)
            if text is not None:
                out[loc] = text
    return out


def edge_shardings(program: Program) -> dict[str, list[TensorSharding | None]]:
    """Per loop or branch location, the sharding each of its edges holds (before sinking)."""
    out: dict[str, list[TensorSharding | None]] = {}
    for op in program.ops:
        if op.kind == EDGE:
            out.setdefault(op.loc, []).append(op.results[0].sharding)
    return out


def instruction_id(inst: Instruction) -> int:
    """An instruction's id (`add.12` -> 12): jaxlib 0.7.1's converter numbers the ops in MLIR order."""
    tail = inst.name.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else -1
