"""MaxText's train steps against XLA:TPU: our bytes per chip from each form, XLA:TPU's, and the plan time.

    .venv/bin/python bench/maxtext_steps.py [DIR] [--write]     # default: tests/fixtures/maxtext

Each step is a `fidelity.run_maxtext` record (MaxText's `train_compile` for a TPU topology, ahead of time)
with its three text forms. Prints a markdown table: per step and form, our HBM per chip for the step's
chip, XLA:TPU's (its buffer assignment's HBM total, `fidelity.run_maxtext.reference_bytes`: what it
allocated, or what it needed when it refused the step), the signed error, XLA:TPU's verdict and ours
(`planner.plan.verdict.call` with the sweep's band for the step's kind), whether our per-device While
shapes equal XLA:TPU's, and the seconds the plan took (parse, propagation, memory) against XLA:TPU's
compile of the step in the same record. Then the error's spread.

`--write` records the signed error per partitioner as the `shardy/maxtext` and `gspmd/maxtext` kinds of
XLA:TPU's band in `planner/data/memory_accuracy.json`: the band the verdict keeps on MaxText's steps
(`planner.plan.verdict.band_of`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FORMS = ("xla_dump.hlo", "hlo", "stablehlo.mlir")


def _path(directory: Path, name: str, form: str) -> Path:
    plain = directory / f"{name}.{form}"
    return plain if plain.exists() else directory / f"{name}.{form}.gz"


def rows(directory: Path) -> list[dict[str, object]]:
    from fidelity.run_maxtext import reference_bytes
    from fidelity.sweep import propagation_agreement
    from planner import parse_hlo_file
    from planner.errors import PlannerError
    from planner.hlo.structure.frontend import front_end_of
    from planner.memory import CHIPS, memory_report
    from planner.plan.verdict import DOES_NOT_FIT, FITS, band_of, call
    from planner.prepare import absent_passes, prepare
    from planner.propagation import propagate

    out = []
    for record_path in sorted(directory.glob("*.xla.json")):
        record = json.loads(record_path.read_text())
        name, chip = record["name"], str(record["topology"]).split("-")[0]
        xla, fits = reference_bytes(record)
        for form in FORMS:
            row: dict[str, object] = {"step": name, "form": form, "partitioner": record["partitioner"],
                                      "xla_bytes": xla, "xla_call": FITS if fits else DOES_NOT_FIT,
                                      "compile_seconds": record.get("compile_seconds")}  # fmt: skip
            start = time.perf_counter()
            try:
                # Prepared as the libtpu that compiled the step: its pipeline's passes, not today's.
                disabled = absent_passes(record["libtpu"])
                prepared = prepare(parse_hlo_file(_path(directory, name, form)), chip, disabled=disabled)
                band = band_of("tpu", record["partitioner"], front_end_of(prepared.source))
                result = propagate(prepared)
                report = memory_report(prepared, result=result)
                row["ours_bytes"] = report.total_bytes
                row["our_call"] = call(report.total_bytes, CHIPS[chip].hbm_bytes, band)
                row["whiles"] = propagation_agreement(prepared, result, record["tpu"]["post_partition_while_shapes"])
            except PlannerError as e:
                row["failure"] = str(e).splitlines()[0]
            row["plan_seconds"] = round(time.perf_counter() - start, 2)
            out.append(row)
    return out


def table(found: list[dict[str, object]]) -> str:
    columns = ("step", "partitioner", "form", "XLA:TPU GiB", "ours GiB", "error", "XLA:TPU", "ours says",
               "While shapes", "plan s", "XLA:TPU compile s")  # fmt: skip
    header = "| " + " | ".join(columns) + " |"
    lines = [header, "|" + "---|" * len(columns)]
    for r in found:
        xla = int(r["xla_bytes"])  # type: ignore[call-overload]
        if "failure" in r:
            cells = f"{xla / 2**30:.2f} | fails: {r['failure']} | | {r['xla_call']} | | |"
        else:
            ours = int(r["ours_bytes"])  # type: ignore[call-overload]
            cells = (f"{xla / 2**30:.2f} | {ours / 2**30:.2f} | {100 * (ours - xla) / xla:+.1f}% | "
                     f"{r['xla_call']} | {r['our_call']} | {r['whiles']} |")  # fmt: skip
        lines.append(f"| {r['step']} | {r['partitioner']} | {r['form']} | {cells} {r['plan_seconds']} | "
                     f"{r['compile_seconds']} |")  # fmt: skip
    return "\n".join(lines)


def spread(found: list[dict[str, object]]) -> str:
    """How many steps (one form each: the forms agree) are within 5% and 10% of XLA:TPU, and the worst."""
    errors = sorted(
        abs(int(r["ours_bytes"]) - int(r["xla_bytes"])) / int(r["xla_bytes"])  # type: ignore[call-overload]
        for r in found
        if r["form"] == FORMS[0] and "ours_bytes" in r
    )
    if not errors:
        return "no step planned"
    within = {limit: sum(e <= limit for e in errors) for limit in (0.05, 0.10)}
    return (f"{len(errors)} steps: within 5% of XLA:TPU on {within[0.05]}, within 10% on {within[0.10]}, "
            f"worst {100 * errors[-1]:.1f}%")  # fmt: skip


def calibration(found: list[dict[str, object]]) -> str:
    """How often the verdict's band holds the truth on a step it was not measured on: each step's band is the
    other steps' signed errors (both partitioners, as `band_of` pools MaxText's), widened by the margin."""
    from planner.plan.verdict import VERDICT_MARGIN

    errors = [
        (str(r["step"]), (int(r["ours_bytes"]) - int(r["xla_bytes"])) / int(r["xla_bytes"]))  # type: ignore[call-overload]
        for r in found
        if r["form"] == FORMS[0] and "ours_bytes" in r
    ]
    if len(errors) < 2:
        return "too few steps to calibrate the band"
    inside = []
    for step, error in errors:
        others = [e for s, e in errors if s != step]
        low, high = min(0.0, min(others)) - VERDICT_MARGIN, max(0.0, max(others)) + VERDICT_MARGIN
        inside.append(low <= error <= high)
    missed = [step for (step, _), ok in zip(errors, inside) if not ok]
    return (f"band calibration (leave one out): the truth falls inside on {sum(inside)} of {len(errors)} steps"
            + (f"; outside on {', '.join(missed)}" if missed else ""))  # fmt: skip


def write_bands(found: list[dict[str, object]], directory: Path) -> str:
    """Record the signed errors (one form per step) as XLA:TPU's `partitioner/maxtext` bands."""
    from fidelity.sweep import record_bands

    measured: dict[str, list[float]] = {}
    for r in found:
        if r["form"] == FORMS[0] and "ours_bytes" in r:
            ours, xla = int(r["ours_bytes"]), int(r["xla_bytes"])  # type: ignore[call-overload]
            measured.setdefault(f"{r['partitioner']}/maxtext", []).append((ours - xla) / xla)
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("*.xla.json"))]
    stacks = {f"jax {r['jax']}, libtpu {r['libtpu']}, {r['generator'].split('(')[-1].rstrip(')')}" for r in records}
    if len(stacks) != 1:
        raise SystemExit(f"the records come from {len(stacks)} stacks ({sorted(stacks)}); record one at a time")
    stack = stacks.pop()
    record_bands({"tpu": measured}, stack)
    return f"recorded {', '.join(f'{k} ({len(v)} steps)' for k, v in sorted(measured.items()))} on {stack}"


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--write"]
    directory = Path(args[0]) if args else REPO / "tests" / "fixtures" / "maxtext"
    found = rows(directory)
    print(table(found))
    print()
    print(spread(found))
    print(calibration(found))
    if "--write" in sys.argv[1:]:
        print(write_bands(found, directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
