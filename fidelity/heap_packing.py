"""Fit and check the model of XLA:TPU's heap packing (`planner.memory.heap_packing`) on MaxText's steps.

    python -m fidelity.heap_packing [DIR ...]      # default: tests/fixtures/maxtext (every folder under it)

Each `fidelity.run_maxtext` record that kept its heap (`tpu.heap`: the heap's bytes, the most its buffers cover
at once by their live ranges, and those buffers' sizes; a step XLA:TPU refused has no packed heap and is left
out) is one measurement of what packing costs: heap / live peak - 1. The steps are split by model and size (the
two partitioners' compiles of one step stay on one side, so neither half has seen the other's twin): the first
of every two such groups, in name order, fits (least squares), the second checks it. The model is proportional
to one over the step's layers (a line through 0); lines in that and in the other features tried (the share of the
live peak its three largest buffers hold, its largest alone, the log of how many buffers make it) are fitted and
checked the same way, beside a constant and no model (0). Prints each one's mean and worst absolute error on both
halves, in points of the live peak; then each group left out in turn, fitted on the others; and whether
`planner.memory.heap_packing` keeps this fit.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner.memory.heap_packing import PACKING_PER_LAYER

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Measurement:
    step: str
    libtpu: str
    overhead: float  # heap / live peak - 1
    features: dict[str, float]


FEATURES = ("1/layers", "top-3 share", "largest share", "log buffers")
MODEL_FEATURE = FEATURES[0]


def measurements(directories: list[Path]) -> list[Measurement]:
    found = []
    for directory in directories:
        for path in sorted(directory.glob("**/*.xla.json")):
            record = json.loads(path.read_text())
            heap = record["tpu"].get("heap")
            if heap is None or "oom" in record["tpu"] or not heap["live_peak_bytes"]:
                continue
            live, sizes = heap["live_peak_bytes"], heap["live_peak_buffer_sizes"]
            features = {
                "1/layers": 1 / max(int(record["layers"] or 1), 1),
                "top-3 share": sum(sizes[:3]) / live,
                "largest share": sizes[0] / live,
                "log buffers": math.log(len(sizes)),
            }
            found.append(Measurement(record["name"], record["libtpu"], heap["heap_bytes"] / live - 1, features))
    return found


def group_of(step: str) -> str:
    """The step without its partitioner: its two compiles are one group."""
    return re.sub(r"_(shardy|gspmd)$", "", step)


def split(found: list[Measurement]) -> tuple[list[Measurement], list[Measurement]]:
    groups = sorted({group_of(m.step) for m in found})
    fit_groups = set(groups[::2])
    fit = [m for m in found if group_of(m.step) in fit_groups]
    return fit, [m for m in found if group_of(m.step) not in fit_groups]


def fit_line(found: list[Measurement], feature: str) -> tuple[float, float]:
    n = len(found)
    xs = [m.features[feature] for m in found]
    mx = sum(xs) / n
    my = sum(m.overhead for m in found) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (m.overhead - my) for x, m in zip(xs, found)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def errors(found: list[Measurement], predict: Callable[[Measurement], float]) -> tuple[float, float]:
    """Mean and worst absolute error (the prediction clipped at 0), in fractions of the live peak."""
    misses = [abs(max(0.0, predict(m)) - m.overhead) for m in found]
    return sum(misses) / len(misses), max(misses)


def proportional_fit(found: list[Measurement], feature: str) -> float:
    """The least-squares slope of a line through 0."""
    xs = [m.features[feature] for m in found]
    return sum(x * m.overhead for x, m in zip(xs, found)) / sum(x * x for x in xs)


def line_of(intercept: float, slope: float, feature: str) -> Callable[[Measurement], float]:
    def predict(m: Measurement) -> float:
        return intercept + slope * m.features[feature]

    return predict


def constant_of(value: float) -> Callable[[Measurement], float]:
    def predict(m: Measurement) -> float:
        return value

    return predict


def leave_one_group_out(found: list[Measurement], feature: str) -> tuple[float, float]:
    """The error on each group of steps of the line (or constant, or none) fitted on every other group."""
    misses = []
    for group in sorted({group_of(m.step) for m in found}):
        train = [m for m in found if group_of(m.step) != group]
        test = [m for m in found if group_of(m.step) == group]
        if feature == "model":
            predict = line_of(0.0, proportional_fit(train, MODEL_FEATURE), MODEL_FEATURE)
        elif feature == "none (0)":
            predict = constant_of(0.0)
        elif feature == "constant":
            predict = constant_of(sum(m.overhead for m in train) / len(train))
        else:
            predict = line_of(*fit_line(train, feature), feature)
        misses += [abs(max(0.0, predict(m)) - m.overhead) for m in test]
    return sum(misses) / len(misses), max(misses)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, default=[REPO / "tests" / "fixtures" / "maxtext"])
    args = parser.parse_args(argv)
    found = measurements(args.dirs)
    fit, check = split(found)
    if len(fit) < 3 or not check:
        print(f"heap_packing: {len(found)} steps kept their heap; too few to fit and check", file=sys.stderr)
        return 2
    slope = proportional_fit(fit, MODEL_FEATURE)
    print(f"| step | libtpu | half | heap over live peak | {MODEL_FEATURE} | modelled |")
    print("|---|---|---|---:|---:|---:|")
    for half, rows in (("fit", fit), ("check", check)):
        for m in rows:
            modelled = slope * m.features[MODEL_FEATURE]
            print(f"| {m.step} | {m.libtpu} | {half} | {100 * m.overhead:+.1f}% | {m.features[MODEL_FEATURE]:.3f} | "
                  f"{100 * modelled:+.1f}% |")  # fmt: skip
    print()
    print(f"{len(fit)} steps fit, {len(check)} check; mean / worst absolute error in points of the live peak:")
    print("| model | fit half | check half |")
    print("|---|---|---|")
    candidates: list[tuple[str, Callable[[Measurement], float]]] = [
        (f"{slope:.4f} * {MODEL_FEATURE} (the model)", line_of(0.0, slope, MODEL_FEATURE))
    ]
    constant = sum(m.overhead for m in fit) / len(fit)
    for feature in FEATURES:
        a, b = fit_line(fit, feature)
        candidates.append((f"{a:.4f} + {b:.4f} * {feature}", line_of(a, b, feature)))
    candidates += [(f"constant {constant:.4f}", constant_of(constant)), ("none (0)", constant_of(0.0))]
    for label, predict in candidates:
        cells = [errors(rows, predict) for rows in (fit, check)]
        print(f"| {label} | " + " | ".join(f"{100 * mean:.1f} / {100 * worst:.1f}" for mean, worst in cells) + " |")
    print()
    print("Each group of steps left out in turn, fitted on all the others (mean / worst):")
    for feature in ("model", *FEATURES, "constant", "none (0)"):
        mean, worst = leave_one_group_out(found, feature)
        print(f"- {feature}: {100 * mean:.1f} / {100 * worst:.1f} points")
    if round(slope, 4) != PACKING_PER_LAYER:
        print(f"planner.memory.heap_packing keeps {PACKING_PER_LAYER} / layers: not this fit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
