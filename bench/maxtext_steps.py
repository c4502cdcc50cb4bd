"""MaxText's train steps against XLA:TPU: our bytes per chip from each form, XLA:TPU's, and the plan time.

    .venv/bin/python bench/maxtext_steps.py [DIR]     # default: tests/fixtures/maxtext

Each step is a `fidelity.run_maxtext` record (MaxText's `train_compile` for a TPU topology, ahead of time)
with its three text forms. Prints a markdown table: per step and form, our HBM per chip for the step's
chip, XLA:TPU's, the signed error, whether our per-device While shapes equal XLA:TPU's, and the seconds the
plan took (parse, propagation, memory) against XLA:TPU's compile of the step in the same record.
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
    from fidelity.sweep import propagation_agreement
    from planner import parse_hlo_file
    from planner.errors import PlannerError
    from planner.memory import memory_report
    from planner.prepare import prepare
    from planner.propagation import propagate

    out = []
    for record_path in sorted(directory.glob("*.xla.json")):
        record = json.loads(record_path.read_text())
        name, chip = record["name"], str(record["topology"]).split("-")[0]
        xla = int(record["tpu"]["memory"]["total_bytes"])
        for form in FORMS:
            row: dict[str, object] = {"step": name, "form": form, "partitioner": record["partitioner"],
                                      "xla_bytes": xla, "compile_seconds": record.get("compile_seconds")}  # fmt: skip
            start = time.perf_counter()
            try:
                prepared = prepare(parse_hlo_file(_path(directory, name, form)), chip)
                result = propagate(prepared)
                row["ours_bytes"] = memory_report(prepared, result=result).total_bytes
                row["whiles"] = propagation_agreement(prepared, result, record["tpu"]["post_partition_while_shapes"])
            except PlannerError as e:
                row["failure"] = str(e).splitlines()[0]
            row["plan_seconds"] = round(time.perf_counter() - start, 2)
            out.append(row)
    return out


def table(found: list[dict[str, object]]) -> str:
    columns = ("step", "partitioner", "form", "XLA:TPU GiB", "ours GiB", "error", "While shapes", "plan s",
               "XLA:TPU compile s")  # fmt: skip
    header = "| " + " | ".join(columns) + " |"
    lines = [header, "|" + "---|" * len(columns)]
    for r in found:
        xla = int(r["xla_bytes"])  # type: ignore[call-overload]
        if "failure" in r:
            cells = f"{xla / 2**30:.2f} | fails: {r['failure']} | | |"
        else:
            ours = int(r["ours_bytes"])  # type: ignore[call-overload]
            cells = f"{xla / 2**30:.2f} | {ours / 2**30:.2f} | {100 * (ours - xla) / xla:+.1f}% | {r['whiles']} |"
        lines.append(f"| {r['step']} | {r['partitioner']} | {r['form']} | {cells} {r['plan_seconds']} | "
                     f"{r['compile_seconds']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures" / "maxtext"
    print(table(rows(directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
