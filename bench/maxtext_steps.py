"""MaxText's train steps against XLA:TPU: our bytes per chip from each form, XLA:TPU's, and the plan time.

    .venv/bin/python bench/maxtext_steps.py [DIR]     # default: tests/fixtures/maxtext

Each step is a `fidelity.run_maxtext` record (MaxText's `train_compile` for a TPU topology, ahead of time)
with its three text forms. Prints a markdown table: per step and form, our HBM per chip for the step's
chip, XLA:TPU's (its buffer assignment's HBM total, `fidelity.run_maxtext.reference_bytes`: what it
allocated, or what it needed when it refused the step), the signed error, XLA:TPU's verdict and ours
(`planner.plan.verdict.call` with the sweep's band for the step's kind), whether our per-device While
shapes equal XLA:TPU's, and the seconds the plan took (parse, propagation, memory) against XLA:TPU's
compile of the step in the same record. Then the error's spread.
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
    from planner.memory import CHIPS, memory_report
    from planner.plan.verdict import DOES_NOT_FIT, FITS, band_of, call
    from planner.prepare import prepare
    from planner.propagation import propagate

    out = []
    for record_path in sorted(directory.glob("*.xla.json")):
        record = json.loads(record_path.read_text())
        name, chip = record["name"], str(record["topology"]).split("-")[0]
        xla, fits = reference_bytes(record)
        band = band_of("tpu", record["partitioner"], "jax")
        for form in FORMS:
            row: dict[str, object] = {"step": name, "form": form, "partitioner": record["partitioner"],
                                      "xla_bytes": xla, "xla_call": FITS if fits else DOES_NOT_FIT,
                                      "compile_seconds": record.get("compile_seconds")}  # fmt: skip
            start = time.perf_counter()
            try:
                prepared = prepare(parse_hlo_file(_path(directory, name, form)), chip)
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


def main() -> int:
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures" / "maxtext"
    found = rows(directory)
    print(table(found))
    print()
    print(spread(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
