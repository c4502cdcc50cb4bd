"""HBM per chip, ours against the real compilers', over every reference case.

    python -m fidelity.sweep [--ci | --cached] [--jobs N] [--write bench/RESULTS.md]

Generates whatever references the cache lacks (`fidelity.references`), then predicts every case for
XLA:CPU and, where the case was compiled for a TPU chip, for XLA:TPU, and prints one row per case and
backend with the error distribution (max, p90, by family and by backend). `--write` replaces the
sweep's section of a results file with the same table and, unless the run was limited to chosen cases
(`--ci`, `--only`), records each kind of step's error band in `planner/data/memory_accuracy.json`, which
memory reports and verdicts quote (`write_accuracy`: each kind on the newest jax that measured it).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fidelity.agreement import (
    ShardingAgreement,
    gradient_outputs_found,
    sharding_agreement,
    under_sharded_gradients,
    while_shape_mismatches,
)
from fidelity.cases import CASES, CI_CASES, FRONT_ENDS, Case, case_named
from fidelity.lowered import lowered_form
from fidelity.memory_stats import compared_bytes, reference_bytes
from fidelity.placement_check import PlacementCheck, check_change_set
from fidelity.references import ensure_references, reference_path, xla_dump_path
from fidelity.stablehlo_forms import ensure_stablehlo_forms, stablehlo_path
from fidelity.stack_rows import StackRows, load_rows, save_rows, stack_name
from planner.hlo.ir.module import HloModule
from planner.plan.compilers.confirmation import CONFIRMED_SHARE
from planner.plan.compilers.verify import libtpu_installed
from planner.plan.model import Plan
from planner.prepare import PreparedModule
from planner.propagation import PropagationResult

# The markers of a results file's sweep section; `--section NAME` writes another one beside it.
SECTION = "sweep"


@dataclass(frozen=True)
class Row:
    case: Case
    backend: str  # "cpu" or the TPU chip preset
    compiler_bytes: int
    ours_bytes: int
    # Our per-device While shapes against this compiler's partitioned ones: "exact", "k of n differ" or
    # "loops differ" (our loops carry other elements than the compiler's do when it partitions).
    propagation: str = "n/a"
    shardings: ShardingAgreement | None = None  # instruction shardings against this compiler's
    # Gradients this compiler leaves under-sharded that our plan for it finds: (found, of).
    gradients: tuple[int, int] | None = None
    # Where the plan for this compiler recommends a change set: the compiler's bytes without and with it.
    placement: PlacementCheck | None = None
    # The plan for this compiler recommends a change set (None: no plan was made, as for torch_xla steps).
    recommends: bool | None = None
    # JAX: the step as `lowered.as_text(dialect="hlo")` prints it (no compile options in the header)
    # propagates to the same shardings and the same bytes as XLA's dump of the compile.
    lowered_agrees: bool | None = None
    # JAX: the same for the step as `lowered.as_text()` prints it by default (StableHLO text).
    stablehlo_agrees: bool | None = None
    # JAX: the same for XLA's own dump of the compile as XLA writes it (`--xla_dump_to`; today's XLA elides
    # get-tuple-elements as `%t#k` operands and prints Shardy shardings natively). None: the case has none.
    dump_agrees: bool | None = None

    @property
    def error(self) -> float:
        return (self.ours_bytes - self.compiler_bytes) / self.compiler_bytes

    @property
    def compiler(self) -> str:
        return "cpu" if self.backend == "cpu" else "tpu"


def compiler_bytes(record: dict[str, object], backend: str) -> int:
    """The compiler's bytes per device: XLA:CPU's argument + output + temp - alias (torch_xla: its buffer
    assignment), XLA:TPU's HBM (`fidelity.memory_stats.reference_bytes`: what it allocated, or what its refusal
    says the step needs)."""
    if backend == "cpu":
        memory = record.get("memory")
        return int(memory["total_bytes"]) if memory else int(record["xla_per_device_total_bytes"])  # type: ignore[index,call-overload]
    return reference_bytes(record)[0]


def predict(case: Case, check_placements: bool = False) -> list[Row]:
    """Our bytes for each compiler that compiled the case, each from its own pipeline's propagation.

    With `check_placements`, each compiler compiles the change set its plan recommends, wherever one is
    recommended (up to three compiles a case and compiler, cached by content)."""
    from planner import parse_hlo_file
    from planner.memory import memory_report
    from planner.prepare import prepare
    from planner.propagation import propagate

    hlo = reference_path(case)
    record = json.loads(hlo.with_suffix(".xla.json").read_text())
    module = parse_hlo_file(hlo)
    tpu = record.get("tpu") or {}
    backends = [("cpu", "cpu")] + ([(case.chip or "tpu", "tpu")] if tpu else [])
    rows = []
    for backend, compiler in backends:
        prepared = prepare(module, backend)
        result = propagate(prepared)
        if compiler == "tpu":
            whiles = tpu.get("post_partition_while_shapes")
            golden_name = tpu.get("pre_propagation_module")
            golden = hlo.with_name(golden_name) if golden_name else None
            xla = tpu.get("instruction_shardings")
            shardings = None
            if golden is not None and golden.exists() and xla:
                shardings = sharding_agreement(prepared, result, xla, parse_hlo_file(golden))
        else:
            whiles = record.get("post_partition_while_shapes") or record.get("xla_post_partition_while_shapes")
            names = record.get("instruction_shardings_keys", "source") == "source"
            xla = record.get("instruction_shardings") or record.get("xla_instruction_shardings")
            shardings = sharding_agreement(prepared, result, xla) if xla and names else None
        report = memory_report(prepared, result=result)
        total = report.total_bytes
        # A step XLA:TPU refuses is quoted before its heap is packed (`compared_bytes`).
        ours = compared_bytes(report, reference_bytes(record)[1]) if compiler == "tpu" else total
        gradients, placement, recommends, lowered, stablehlo, dump = None, None, None, None, None, None
        if case.front_end == "jax":
            lowered = _lowered_agrees(hlo, backend, result, total)
            stablehlo = _stablehlo_agrees(case, backend, result, total)
            dump = _dump_agrees(case, backend, result, total)
            gradients, (plan, patched) = _gradients_found(prepared, record, compiler)
            recommends = any(p.recommended for p in plan.placements)
            topology = case.tpu_topology if compiler == "tpu" else None
            if check_placements and recommends and (compiler == "cpu" or topology):
                placement = check_change_set(
                    module, prepared.written_front, patched, plan, case.mesh.num_devices, topology
                )
        rows.append(Row(case, backend, compiler_bytes(record, compiler), ours,
                        propagation_agreement(prepared, result, whiles), shardings, gradients, placement,
                        recommends, lowered, stablehlo, dump))  # fmt: skip
    return rows


def _lowered_agrees(hlo: Path, backend: str, dump_result: PropagationResult, dump_total: int) -> bool:
    """Whether the lowered form of the step (`fidelity.lowered`) propagates and sizes as XLA's dump does."""
    from planner import parse_hlo
    from planner.memory import memory_report
    from planner.prepare import prepare
    from planner.propagation import propagate

    pasted = prepare(parse_hlo(lowered_form(hlo.read_text())), backend)
    result = propagate(pasted)
    same = {i.name: i.sharding for i in result.instructions} == {i.name: i.sharding for i in dump_result.instructions}
    return same and memory_report(pasted, result=result).total_bytes == dump_total


def _stablehlo_agrees(case: Case, backend: str, dump_result: PropagationResult, dump_total: int) -> bool:
    """Whether the StableHLO form of the step (`fidelity.stablehlo_forms`) propagates and sizes as XLA's dump
    does. Its instructions are the dump's in the same order under generic names (`as_text()` prints no
    locations), so they are compared in order."""
    from planner import parse_hlo
    from planner.memory import memory_report
    from planner.prepare import prepare
    from planner.propagation import propagate

    ensure_stablehlo_forms([case])  # lowered once, cached by content (a clean checkout has none)
    pasted = prepare(parse_hlo(stablehlo_path(case).read_text()), backend)
    result = propagate(pasted)
    same = [(i.opcode, i.sharding) for i in result.instructions] == [
        (i.opcode, i.sharding) for i in dump_result.instructions
    ]
    return same and memory_report(pasted, result=result).total_bytes == dump_total


def _dump_agrees(case: Case, backend: str, dump_result: PropagationResult, dump_total: int) -> bool | None:
    """Whether XLA's dump of the compile, as XLA wrote it, propagates and sizes as the step's NAME.hlo does.

    The dump has the lowered text's instructions under the same names, but where today's XLA elides a
    get-tuple-element (`%t#k`, one per element however many read it) the lowered text has one per reader:
    those are compared by the (tuple, index) they read, the rest by name.
    """
    from planner import parse_hlo
    from planner.hlo.text.shardy_import import SHARDY, partitioner_of
    from planner.memory import memory_report
    from planner.prepare import prepare
    from planner.propagation import propagate

    path = xla_dump_path(case)
    if not path.exists():
        return None
    parsed = parse_hlo(path.read_text())
    written = prepare(parsed, backend)
    result = propagate(written)
    if memory_report(written, result=result).total_bytes != dump_total:
        return False

    def split(instructions: tuple[Any, ...]) -> tuple[dict[str, Any], dict[tuple[str, int], set[Any]], set[Any]]:
        named = {i.name: i.sharding for i in instructions if i.opcode != "get-tuple-element"}
        elements: dict[tuple[str, int], set[Any]] = {}
        read = {operand for i in instructions for operand in i.operands}
        readers: set[tuple[str, int]] = set()
        for i in instructions:
            if i.opcode == "get-tuple-element":
                elements.setdefault((i.operands[0], i.tuple_index), set()).add(i.sharding)
                if i.name in read:
                    readers.add((i.operands[0], i.tuple_index))
        return named, elements, elements.keys() - readers

    named, elements, unread = split(result.instructions)
    dump_named, dump_elements, dump_unread = split(dump_result.instructions)
    # An element one form reads and the other does not is dead code in the first (a loop condition's
    # get-tuple-elements of everything but its counter, which only the lowered text writes).
    one_sided = elements.keys() ^ dump_elements.keys()
    dead = one_sided <= (unread | dump_unread)
    same_elements = all(elements[k] == dump_elements[k] for k in elements.keys() & dump_elements.keys())
    if named.keys() == dump_named.keys() or partitioner_of(parsed) != SHARDY:
        return dead and same_elements and named == dump_named

    # A Shardy compile's dump is XLA's re-export of the module, under its own names, with each result's
    # sharding on the root where the lowered text has an `xla.sdy.FuncResultSharding` call (read onto the
    # root too; one with open dims stays a copy): the same instructions are compared by what they are and
    # how they are split.
    def kinds(instructions: tuple[Any, ...]) -> Counter[tuple[str, Any]]:
        return Counter((i.opcode, i.sharding) for i in instructions if i.opcode not in ("get-tuple-element", "copy"))

    return kinds(result.instructions) == kinds(dump_result.instructions)


def _gradients_found(
    prepared: PreparedModule, record: dict[str, Any], compiler: str
) -> tuple[tuple[int, int] | None, tuple[Plan, HloModule]]:
    """Of the gradient outputs the compiler leaves under-sharded, how many our plan for it finds (None where it
    refused the step: a refusal has no outputs); and the plan with its patched module."""
    from planner.plan.planner import make_plan

    plan, patched = make_plan(prepared)
    if compiler == "tpu" and not reference_bytes(record)[1]:
        return None, (plan, patched)
    expected = under_sharded_gradients(record, compiler)
    return (len(expected & gradient_outputs_found(prepared, plan)), len(expected)), (plan, patched)


def propagation_agreement(
    prepared: PreparedModule, result: PropagationResult, whiles: list[dict[str, str]] | None
) -> str:
    if not whiles:
        return "n/a"
    compared, misses = while_shape_mismatches(prepared, whiles, result)
    if any("loops of arity" in m for m in misses):
        return "loops differ"
    return "exact" if not misses else f"{len(misses)} of {compared} differ"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if ordered else 0.0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def _placement(row: Row) -> str:
    check = row.placement
    if check is None:
        return "no change recommended" if row.recommends is False else "n/a"
    verb = "saves" if check.confirmed else "does not save:" if not check.saves else "over-claimed: saves"
    text = f"{verb} {_mib(check.xla_saving)} (predicted {_mib(check.predicted_saving)})"
    if abs(check.xla_before - check.xla_as_given) > 0.01 * check.xla_as_given:
        text += f"; inlined {_mib(check.xla_before)}, as given {_mib(check.xla_as_given)}"
    if check.under_sharded_after:
        text += f"; gradients still under-sharded: {', '.join(check.under_sharded_after)}"
    return text


def _cells(row: Row | None) -> str:
    if row is None:
        return "| | | | | | | |"
    shardings = row.shardings.text() if row.shardings is not None else "n/a"
    gradients = f"{row.gradients[0]} of {row.gradients[1]}" if row.gradients is not None else "n/a"
    return (f"| {_mib(row.compiler_bytes)} | {_mib(row.ours_bytes)} | {row.error:+.1%} | {row.propagation} "
            f"| {shardings} | {gradients} | {_placement(row)} |")  # fmt: skip


def _beside_cells(pair: dict[str, Row], theirs: dict[tuple[str, str], Row]) -> str:
    """The other stack's compilers' bytes for the case (`theirs`: its rows by case and compiler)."""
    if any(r is theirs.get((r.case.name, r.compiler)) for r in pair.values()):
        return "| (the row itself) | (the row itself) |"
    cells = []
    for compiler in ("cpu", "tpu"):
        row = pair.get(compiler)
        other = theirs.get((row.case.name, compiler)) if row is not None else None
        cells.append(f"{_mib(other.compiler_bytes)} ({other.error:+.1%})" if other is not None else "")
    return "| " + " | ".join(cells) + " |"


def render(rows: list[Row], beside: StackRows | None = None) -> str:
    """One line per case, each compiler's half side by side; with `beside`, two more columns: the compilers'
    bytes for the case on that other stack (our error there in brackets), or that the row is that stack's."""
    header = (
        "| case | step | mesh | remat | dtype | partitioner "
        "| XLA:CPU MiB | ours | error | While shapes vs XLA:CPU | shardings = XLA:CPU | under-sharded gradients found "
        "| plan's change set on XLA:CPU, MiB per chip "
        "| chip | XLA:TPU MiB | ours | error | While shapes vs XLA:TPU | shardings = XLA:TPU "
        "| under-sharded gradients found | plan's change set on XLA:TPU, MiB per chip |"
    )
    rule = "|---|---|---|---|---|---|---:|---:|---:|---|---|---|---|---|---:|---:|---:|---|---|---|---|"
    if beside is not None:
        header += f" XLA:CPU MiB on {beside.stack} | XLA:TPU MiB on {beside.stack} |"
        rule += "---:|---:|"
    lines = [header, rule]
    theirs = beside.by_case() if beside is not None else {}
    by_case: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_case.setdefault(r.case.name, {})[r.compiler] = r
    for name, pair in by_case.items():
        c = next(iter(pair.values())).case
        tpu = pair.get("tpu")
        line = (
            f"| {name} | {c.step} | {'x'.join(map(str, c.mesh.shape))} | {c.remat or 'none'} | {c.size.dtype} "
            f"| {c.partitioner} {_cells(pair.get('cpu'))} {tpu.backend if tpu else ''} {_cells(tpu)}"
        )
        if beside is not None:
            line += " " + _beside_cells(pair, theirs)
        lines.append(line)
    lines += ["", *_goals(rows), "",
              "| group | cases | max abs error | p90 abs error | within 5% | within 10% |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    groups: dict[str, list[Row]] = {"all": rows}
    for r in rows:
        compiler = r.compiler
        groups.setdefault(f"backend {compiler}", []).append(r)
        if r.propagation == "exact":
            groups.setdefault(f"backend {compiler}, While shapes exact", []).append(r)
        groups.setdefault(f"family {r.case.family} ({r.case.front_end}), {compiler}", []).append(r)
        groups.setdefault(f"step {r.case.step}, {compiler}", []).append(r)
        groups.setdefault(f"partitioner {r.case.partitioner}, {compiler}", []).append(r)
        groups.setdefault(f"remat {r.case.remat or 'none'}, {compiler}", []).append(r)
        groups.setdefault(f"dtype {r.case.size.dtype}, {compiler}", []).append(r)
    for name, group in sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0])):
        errors = [abs(r.error) for r in group]
        lines.append(
            f"| {name} | {len(group)} | {max(errors):.1%} | {_percentile(errors, 0.9):.1%} "
            f"| {sum(e <= 0.05 for e in errors)} | {sum(e <= 0.10 for e in errors)} |"
        )
    return "\n".join(lines)


def _goals(rows: list[Row]) -> list[str]:
    """The measures the TPU target is held to, over the GSPMD JAX cases XLA:TPU compiled."""
    tpu = [r for r in rows if r.compiler == "tpu" and r.case.partitioner == "gspmd" and r.case.front_end == "jax"]
    if not tpu:
        return []
    errors = [abs(r.error) for r in tpu]
    exact = sum(r.propagation == "exact" for r in tpu)
    compared = [r.shardings for r in tpu if r.shardings is not None and r.shardings.compared]
    worst = min((a.share for a in compared), default=0.0)
    with_gradients = [r for r in tpu if r.gradients is not None and r.gradients[1]]
    all_found = sum(r.gradients[0] == r.gradients[1] for r in with_gradients)  # type: ignore[index]
    return [
        f"GSPMD JAX cases compiled for XLA:TPU: {len(tpu)}. While shapes equal XLA:TPU's on {exact}; "
        f"instruction shardings equal XLA:TPU's on {worst:.1%} of compared instructions in the worst case "
        f"({len(compared)} cases compared); every gradient XLA:TPU leaves under-sharded is a finding on "
        f"{all_found} of the {len(with_gradients)} cases that have one; HBM per chip within 10% of XLA:TPU on "
        f"{sum(e <= 0.10 for e in errors)} ({sum(e <= 0.10 for e in errors) / len(tpu):.0%}), p90 "
        f"{_percentile(errors, 0.9):.1%}.",
        "",
        *(_recommendations(rows, compiler) for compiler in ("cpu", "tpu")),
        _verdicts(rows),
        _lowered(rows),
    ]


def mixed_outputs_line() -> str:
    """`plan --verify` on the step returning donated params and state pinned beside free gradients, in both forms
    a user hands it over, on both compilers: what each compiled, beside JAX's own compile of the step."""
    from fidelity import mixed_outputs
    from planner import parse_hlo
    from planner.plan.planner import make_plan
    from planner.prepare import prepare

    out = mixed_outputs.ensure_reference()
    record = json.loads((out / f"{mixed_outputs.NAME}.xla.json").read_text())
    cells = []
    forms = {"hlo": "XLA dump", "lowered.hlo": "lowered HLO text", "stablehlo.mlir": "StableHLO text"}
    for form, label in forms.items():
        plan, _ = make_plan(prepare(parse_hlo((out / f"{mixed_outputs.NAME}.{form}").read_text()), "v6e"), verify=True)
        checked = plan.verification
        cpu = checked.given_total_bytes if checked is not None else None
        tpu = checked.tpu.given_total_bytes if checked is not None and checked.tpu is not None else None
        if cpu is None or tpu is None:
            cells.append(f"{form}: verify did not compile ({plan.verification_skipped})")
            continue
        cells.append(f"{label}: XLA:CPU {_mib(cpu)}, XLA:TPU {_mib(tpu)} MiB per chip")
    return (
        f"- Mixed pinned and free outputs ({mixed_outputs.NAME}: AdamW returning params and state pinned and "
        f"donated, gradients free): `plan --verify` compiles it with a propagation flag per output; "
        f"{'; '.join(cells)}. JAX's own compile of the step: XLA:CPU {_mib(record['cpu']['total_bytes'])}, "
        f"XLA:TPU {_mib(record['tpu']['hbm_bytes'])} MiB of HBM per chip."
    )


def _lowered(rows: list[Row]) -> str:
    def agree(attribute: str) -> str:
        checked = [r for r in rows if getattr(r, attribute) is not None]
        differ = [f"{r.case.name} ({r.compiler})" for r in checked if not getattr(r, attribute)]
        return f"{len(checked) - len(differ)} of {len(checked)} case-compiler pairs" + (
            f" (not on {'; '.join(differ[:5])})" if differ else ""
        )

    return (
        f'- JAX steps as `lowered.as_text(dialect="hlo")` prints them (no compile options in the header), read '
        f"with JAX's defaults: the same shardings and bytes as XLA's dump of the compile on "
        f"{agree('lowered_agrees')}. As `lowered.as_text()` prints them (StableHLO text, each output's flag read "
        f"from its result's sharding attribute): the same on {agree('stablehlo_agrees')}. As XLA dumps the compile "
        f"(`--xla_dump_to`, where it writes one): the same on {agree('dump_agrees')}."
    )


def _verdicts(rows: list[Row]) -> str:
    calls = verdict_calls(rows)
    total = sum(len(v) for v in calls.values())
    opposite = "; ".join(calls["opposite"][:5])
    return (
        f"- Fit verdicts over every case and compiler against every chip preset's capacity ({total}): "
        f"{len(calls['right'])} right, {len(calls['too close'])} too close to call, {len(calls['opposite'])} "
        f"the opposite of the compiler's" + (f" ({opposite})" if opposite else "") + "."
    )


def verdict_calls(rows: list[Row]) -> dict[str, list[str]]:
    """Every row's verdict against every chip preset's capacity, before the plan and (where its change set was
    compiled) after it, checked against the compiler's own bytes: right, too close to call, or opposite."""
    from planner.memory.chips import CHIPS
    from planner.plan.verdict import DOES_NOT_FIT, FITS, band_of, call

    calls: dict[str, list[str]] = {"right": [], "too close": [], "opposite": []}
    for r in rows:
        band = band_of(r.compiler, r.case.partitioner, r.case.front_end)
        pairs = [("before", r.ours_bytes, r.compiler_bytes)]
        if r.placement is not None:
            pairs.append(("after", r.placement.predicted_after, r.placement.xla_after))
        for chip in CHIPS.values():
            for when, ours, theirs in pairs:
                said = call(ours, chip.hbm_bytes, band)
                label = f"{r.case.name} {r.backend} {when} on {chip.name}"
                if said not in (FITS, DOES_NOT_FIT):
                    calls["too close"].append(label)
                elif (said == FITS) == (theirs <= chip.hbm_bytes):
                    calls["right"].append(label)
                else:
                    calls["opposite"].append(f"{label}: ours {_mib(ours)}, compiler {_mib(theirs)} MiB")
    return calls


def _recommendations(rows: list[Row], compiler: str) -> str:
    """What the plans for one compiler recommend, and what that compiler measures of it."""
    planned = [r for r in rows if r.compiler == compiler and r.recommends is not None]
    recommending = [r for r in planned if r.recommends]
    pinned = [r for r in recommending if r.case.pinned]
    checked = [r.placement for r in recommending if r.placement is not None]
    read = [c for c in checked if c.under_sharded_after is not None]
    name = "XLA:CPU" if compiler == "cpu" else "XLA:TPU"
    return (
        f"- Plans for {name} ({len(planned)} JAX cases): a change set is recommended on {len(recommending)} "
        f"({len(pinned)} of them with gradients already pinned); {name} compiled {len(checked)}: "
        f"{sum(c.confirmed for c in checked)} confirmed (at least {CONFIRMED_SHARE:.0%} of the predicted saving), "
        f"{sum(c.saves and not c.confirmed for c in checked)} save less than that, "
        f"{sum(not c.saves for c in checked)} save nothing; with the change set in, {name} returns every gradient "
        f"at its parameter's shard on {sum(not c.under_sharded_after for c in read)} of the {len(read)} whose "
        "output shardings it reports."
    )


def write_accuracy(rows: list[Row]) -> None:
    """Record each kind of step's error band from this sweep's rows (`record_bands`)."""
    measured: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        measured.setdefault(r.compiler, {}).setdefault(_kind(r.case), []).append(r.error)
    record_bands(measured, stack_name())


def record_bands(measured: dict[str, dict[str, list[float]]], stack: str) -> None:
    """Record each kind of step's error band, {compiler: {kind: signed errors}}, measured on the newest stack its
    users have.

    JAX and torch_xla users compile on different stacks (jax 0.12 with its libtpu; torch_xla 2.9 with the
    jax 0.7.1 it pins), and no one run measures every kind (MaxText's steps are compiled by its own runner). So
    each kind (`partitioner/front end`) keeps the errors of the newest jax that measured it: a run on an older
    stack leaves a newer one's band where it is, and a kind this run did not measure keeps what the file has.
    The compiler's overall band is taken over the errors every kind kept."""
    from planner.memory.report import ACCURACY_FILE

    recorded = json.loads(ACCURACY_FILE.read_text()) if ACCURACY_FILE.exists() else {}
    bands: dict[str, dict[str, Any]] = {}
    for compiler in ("cpu", "tpu"):
        kinds: dict[str, dict[str, Any]] = dict(recorded.get(compiler, {}).get("kinds", {}))
        for kind, signed in sorted(measured.get(compiler, {}).items()):
            before = kinds.get(kind)
            if before is not None and _jax_of(before.get("stack", "")) > _jax_of(stack):
                continue
            kinds[kind] = {**_signed(signed), "stack": stack,
                           "errors": sorted(round(abs(e), 4) for e in signed)}  # fmt: skip
        errors = [e for band in kinds.values() for e in band.get("errors", ())]
        if not errors:
            continue
        bands[compiler] = {"num_cases": len(errors), "p90": _percentile(errors, 0.9), "max": max(errors),
                           "under": min(band["under"] for band in kinds.values()),
                           "over": max(band["over"] for band in kinds.values()), "kinds": kinds}  # fmt: skip
    ACCURACY_FILE.write_text(json.dumps(bands, indent=1) + "\n")


def _jax_of(stack: str) -> tuple[int, ...]:
    """The jax release a stack name (`stack_name()`) says, as numbers; () when it names none."""
    for part in stack.split(", "):
        if part.startswith("jax "):
            return tuple(int(n) for n in re.findall(r"\d+", part.removeprefix("jax ")))
    return ()


def _kind(case: Case) -> str:
    """The kind of step a verdict's error band is measured on: its partitioner and front end."""
    return f"{case.partitioner}/{case.front_end}"


def _signed(errors: list[float]) -> dict[str, Any]:
    """The most the model has been under and over the compiler, signed, rounded outwards."""
    return {"num_cases": len(errors), "under": math.floor(min(0.0, *errors) * 1e4) / 1e4,
            "over": math.ceil(max(0.0, *errors) * 1e4) / 1e4}  # fmt: skip


def write_section(path: Path, table: str, name: str = SECTION) -> None:
    text = path.read_text() if path.exists() else ""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ci", action="store_true", help="only the fixed subset the tests run")
    ap.add_argument("--only", action="append", metavar="NAME", help="only this case (repeatable)")
    ap.add_argument("--cached", action="store_true", help="only the cases whose references are already generated")
    ap.add_argument("--jobs", type=int, default=2, help="cases compiled side by side (default 2)")
    ap.add_argument("--write", type=Path, help="replace the sweep section of this markdown file")
    ap.add_argument("--no-placements", action="store_true",
                    help="skip compiling the TPU plans' change sets with libtpu")  # fmt: skip
    ap.add_argument("--front-end", choices=FRONT_ENDS, help="only this front end's cases")
    ap.add_argument("--section", default=SECTION,
                    help="with --write: the section of the file to write")  # fmt: skip
    ap.add_argument("--save-rows", type=Path, metavar="FILE", help="keep the rows for another stack's sweep")
    ap.add_argument("--beside", type=Path, metavar="FILE",
                    help="rows another stack's sweep saved: cases this one lacks, compilers' bytes")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        beside = load_rows(args.beside) if args.beside else None
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    names = args.only or (list(CI_CASES) if args.ci else None)
    cases = [case_named(n) for n in names] if names else list(CASES)
    if args.front_end:
        cases = [c for c in cases if c.front_end == args.front_end]
    if args.cached:
        cases = [c for c in cases if reference_path(c).with_suffix(".xla.json").exists()]
    failed = ensure_references(cases, args.jobs)
    if failed:
        print(f"{len(failed)} references failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    ensure_stablehlo_forms([c for c in cases if c.front_end == "jax"])
    check = not args.no_placements and libtpu_installed()
    rows = [row for case in cases for row in predict(case, check_placements=check)]
    if args.save_rows:
        save_rows(args.save_rows, rows)
    measured = {r.case.name for r in rows}
    own = list(rows)
    if beside is not None:
        rows += [r for r in beside.rows if r.case.name not in measured]
    table = render(rows, beside)
    if check and not names:
        table += "\n\n" + mixed_outputs_line()
    print(table)
    if args.write:
        names_shown = {r.case.name for r in rows}
        counted = f"{len(names_shown)} of {len(CASES)} cases"
        here = f"measured on {stack_name()}"
        if beside is not None:
            here += f"; {len(names_shown - measured)} more on {beside.stack}"
        write_section(args.write, f"{counted}, {here}.\n\n{table}", args.section)
        if not names:
            # A chosen few cases are not a kind's band; another stack's rows are that stack's to record.
            write_accuracy(own)
    return 0


if __name__ == "__main__":
    # Through the module's own name, so that the rows `--save-rows` pickles name `fidelity.sweep.Row`, which
    # another process can load, and not `__main__.Row`.
    from fidelity import sweep

    sys.exit(sweep.main())
