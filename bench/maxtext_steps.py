"""MaxText's train steps against XLA:TPU: our bytes per chip from each form, XLA:TPU's, and the plan time.

    .venv/bin/python bench/maxtext_steps.py [DIR] [--write]     # default: tests/fixtures/maxtext

Each step is a `fidelity.run_maxtext` record (MaxText's `train_compile` for a TPU topology, ahead of time)
with its three text forms, in DIR or a folder under it (one per libtpu: `libtpu_0_0_52/`). Each is prepared
as the libtpu that compiled it (`prepare(..., libtpu=)`). Prints a markdown table: per step and form, our HBM
per chip for the step's chip, XLA:TPU's (its buffer assignment's HBM total,
`fidelity.memory_stats.reference_bytes`: what it allocated, or what it needed when it refused the step), the
signed error, XLA:TPU's verdict and ours (`planner.plan.verdict.call` with the band a plan draws for the
step), whether our per-device While shapes equal XLA:TPU's, and the seconds the plan took (parse,
propagation, memory) against XLA:TPU's compile of the step in the same record. Then the error's spread per
libtpu, and the band's calibration: each step left out of its own band (`calibration`).

`--write` records the signed error per partitioner as the `shardy/maxtext` and `gspmd/maxtext` kinds of
XLA:TPU's band in `planner/data/memory_accuracy.json`, each step with its traits (`steps`): the references the
verdict's band on a MaxText step is drawn from (`planner.plan.similar_steps`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.plan.similar_steps import ReferenceStep

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FORMS = ("xla_dump.hlo", "hlo", "stablehlo.mlir")


def _path(directory: Path, name: str, form: str) -> Path:
    plain = directory / f"{name}.{form}"
    return plain if plain.exists() else directory / f"{name}.{form}.gz"


def rows(directory: Path) -> list[dict[str, object]]:
    from fidelity.memory_stats import compared_bytes, reference_bytes
    from fidelity.sweep import propagation_agreement
    from planner import parse_hlo_file
    from planner.errors import PlannerError
    from planner.hlo.structure.frontend import front_end_of
    from planner.memory import CHIPS, memory_report
    from planner.plan.similar_steps import StepTraits
    from planner.plan.verdict import DOES_NOT_FIT, FITS, band_of, call
    from planner.prepare import prepare
    from planner.propagation import propagate

    out = []
    for record_path in sorted(directory.glob("**/*.xla.json")):
        record = json.loads(record_path.read_text())
        name, chip = record["name"], str(record["topology"]).split("-")[0]
        folder = record_path.parent
        xla, fits = reference_bytes(record)
        for form in FORMS:
            row: dict[str, object] = {"step": name, "form": form, "partitioner": record["partitioner"],
                                      "libtpu": record["libtpu"], "chip": chip, "xla_bytes": xla,
                                      "xla_call": FITS if fits else DOES_NOT_FIT,
                                      "compile_seconds": record.get("compile_seconds")}  # fmt: skip
            start = time.perf_counter()
            try:
                # Prepared as the libtpu that compiled it: its pipeline's passes and memory rules, not today's.
                prepared = prepare(parse_hlo_file(_path(folder, name, form)), chip, libtpu=record["libtpu"])
                result = propagate(prepared)
                report = memory_report(prepared, result=result)
                traits = StepTraits(record["libtpu"], record["partitioner"], chip, report.total_bytes)
                band = band_of("tpu", record["partitioner"], front_end_of(prepared.source), traits)
                row["ours_bytes"] = compared_bytes(report, fits)
                row["band"] = None if band is None else (band.under, band.over)
                row["our_call"] = call(report.total_bytes, CHIPS[chip].hbm_bytes, band)
                row["whiles"] = propagation_agreement(prepared, result, record["tpu"]["post_partition_while_shapes"])
            except PlannerError as e:
                row["failure"] = str(e).splitlines()[0]
            row["plan_seconds"] = round(time.perf_counter() - start, 2)
            out.append(row)
    return out


def table(found: list[dict[str, object]]) -> str:
    columns = ("step", "libtpu", "partitioner", "form", "XLA:TPU GiB", "ours GiB", "error", "XLA:TPU", "ours says",
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
        lines.append(f"| {r['step']} | {r['libtpu']} | {r['partitioner']} | {r['form']} | {cells} "
                     f"{r['plan_seconds']} | {r['compile_seconds']} |")  # fmt: skip
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


def _key(row: dict[str, object]) -> str:
    """A step's name among both libtpus' steps: `maxtext_llama3-8b_L4_v6e-8_shardy@0.0.52`."""
    return f"{row['step']}@{row['libtpu']}"


def _references(found: list[dict[str, object]]) -> list[ReferenceStep]:
    """Each planned step (one form: the forms agree) as a reference of the verdict's band."""
    from planner.plan.similar_steps import ReferenceStep

    return [
        ReferenceStep(_key(r),
                      round((int(r["ours_bytes"]) - int(r["xla_bytes"])) / int(r["xla_bytes"]), 4),  # type: ignore[call-overload]
                      str(r["libtpu"]), str(r["partitioner"]), str(r["chip"]), int(r["ours_bytes"]))  # type: ignore[call-overload]
        for r in found
        if r["form"] == FORMS[0] and "ours_bytes" in r
    ]  # fmt: skip


def calibration(found: list[dict[str, object]]) -> str:
    """How often the verdict's band holds the truth on a step it was not measured on: each step's band is drawn
    from the other steps (`similar_steps`, as a plan draws it), and XLA:TPU's bytes fall inside it or not. Then
    the verdicts those bands give: opposite XLA:TPU's, and "too close to call" where XLA:TPU's need is 10% or more
    from the chip's capacity."""
    from planner.memory import CHIPS
    from planner.plan.similar_steps import StepTraits, similar_band
    from planner.plan.verdict import DOES_NOT_FIT, FITS, TOO_CLOSE, Band, call

    references = _references(found)
    if len(references) < 2:
        return "too few steps to calibrate the band"
    inside, missed, widths, opposite, timid = 0, [], [], [], []
    by_name = {_key(r): r for r in found if r["form"] == FORMS[0] and "ours_bytes" in r}
    for ref in references:
        others = [o for o in references if o.name != ref.name]
        band = similar_band(StepTraits(ref.libtpu, ref.partitioner, ref.chip, ref.predicted_bytes), others)
        if band is None:
            missed.append(f"{ref.name} (no band)")
            continue
        _, under, over = band
        widths.append(over - under)
        if under <= ref.error <= over:
            inside += 1
        else:
            missed.append(f"{ref.name} ({100 * ref.error:+.1f}% against {100 * under:+.1f}%..{100 * over:+.1f}%)")
        row = by_name[ref.name]
        capacity = CHIPS[ref.chip].hbm_bytes
        said = call(ref.predicted_bytes, capacity, Band("left out", 0, under, over))
        truth = row["xla_call"]
        if said in (FITS, DOES_NOT_FIT) and said != truth:
            opposite.append(ref.name)
        if said == TOO_CLOSE and abs(int(row["xla_bytes"]) - capacity) >= 0.10 * capacity:  # type: ignore[call-overload]
            timid.append(ref.name)
    widths.sort()
    return (f"band calibration (each step left out of its own band): XLA:TPU's bytes inside on {inside} of "
            f"{len(references)} steps; band width median {100 * widths[len(widths) // 2]:.1f} points, widest "
            f"{100 * widths[-1]:.1f}; verdicts opposite XLA:TPU's: {len(opposite)}; too close to call 10% or more "
            f"from capacity: {len(timid)}" + (f"; outside: {', '.join(missed)}" if missed else "")
            + (f"; opposite: {', '.join(opposite)}" if opposite else "")
            + (f"; timid: {', '.join(timid)}" if timid else ""))  # fmt: skip


def write_bands(found: list[dict[str, object]]) -> str:
    """Record the signed errors (one form per step) as XLA:TPU's `partitioner/maxtext` bands, with each step's
    traits for the band drawn from the steps most like a plan's (`planner.plan.similar_steps`)."""
    from dataclasses import asdict

    from fidelity.sweep import record_bands
    from planner.memory.report import ACCURACY_FILE

    references = _references(found)
    measured: dict[str, list[float]] = {}
    for ref in references:
        measured.setdefault(f"{ref.partitioner}/maxtext", []).append(ref.error)
    stacks = sorted({str(r["libtpu"]) for r in found}, key=lambda v: tuple(int(p) for p in v.split(".")))
    stack = f"maxtext 0.2.5, libtpu {', '.join(stacks)}"
    record_bands({"tpu": measured}, stack)
    recorded = json.loads(ACCURACY_FILE.read_text())
    for kind, own in recorded["tpu"]["kinds"].items():
        if kind.endswith("/maxtext"):
            own["steps"] = [asdict(r) for r in references if f"{r.partitioner}/maxtext" == kind]
    ACCURACY_FILE.write_text(json.dumps(recorded, indent=1) + "\n")
    return f"recorded {', '.join(f'{k} ({len(v)} steps)' for k, v in sorted(measured.items()))} on {stack}"


def spread_by_libtpu(found: list[dict[str, object]]) -> str:
    """`spread` per libtpu release: the goal is met per release."""
    releases = sorted({str(r["libtpu"]) for r in found})
    return "\n".join(f"libtpu {v}: " + spread([r for r in found if r["libtpu"] == v]) for v in releases)


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--write"]
    directory = Path(args[0]) if args else REPO / "tests" / "fixtures" / "maxtext"
    found = rows(directory)
    print(table(found))
    print()
    print(spread_by_libtpu(found))
    print(calibration(found))
    if "--write" in sys.argv[1:]:
        print(write_bands(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
