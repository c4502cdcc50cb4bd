"""The verdict's band drawn from the reference steps most like this one.

A kind's widest error (`signed_error`) lets its worst step decide every verdict of the kind: one Gemma step
10% low widens the band of a Llama step that has been within 2%. Where the references recorded what a plan
knows of a step before anything is compiled (the libtpu it is compiled with, the partitioner, the chip and
the bytes per chip predicted: `ReferenceStep`), each reference is weighted by how like this step it is, and
the band is the weighted 5th to 95th percentile of their signed errors, widened by `SIMILAR_MARGIN`.

The weights are what the errors measured depend on: a libtpu release allocates its own way (0.0.52 holds
SparseCore tables outside the heap), a partitioner leaves its own loops, a chip has its own layouts and
thresholds, and packing matters more where few large buffers make the peak (smaller steps). How well the
band holds is measured, not assumed: `bench/maxtext_steps.py` leaves each step out of its own band and counts
how often XLA:TPU's bytes fall inside.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

# A reference of the same libtpu, partitioner or chip counts this many times one that differs.
SAME_LIBTPU, SAME_PARTITIONER, SAME_CHIP = 4.0, 2.0, 2.0
# The band's percentiles, and what widens them: a percentile of a few dozen steps is itself uncertain.
LOW_QUANTILE, HIGH_QUANTILE = 0.05, 0.95
SIMILAR_MARGIN = 0.02
# Fewer references than this, by their effective number, and the kind's widest error is used instead.
MIN_EFFECTIVE_STEPS = 5.0


@dataclass(frozen=True)
class ReferenceStep:
    """A reference step's signed error, (ours - compiler) / compiler, and what a plan knew of it."""

    name: str
    error: float
    libtpu: str | None
    partitioner: str
    chip: str
    predicted_bytes: int


@dataclass(frozen=True)
class StepTraits:
    """What a plan knows of the step it is deciding on."""

    libtpu: str | None
    partitioner: str
    chip: str
    predicted_bytes: int


def weight(step: StepTraits, reference: ReferenceStep) -> float:
    """How much `reference` says of `step`: the same libtpu, partitioner and chip multiply it, and a reference k
    times larger or smaller (bytes per chip) counts 1/k as much."""
    w = SAME_LIBTPU if reference.libtpu == step.libtpu else 1.0
    w *= SAME_PARTITIONER if reference.partitioner == step.partitioner else 1.0
    w *= SAME_CHIP if reference.chip == step.chip else 1.0
    ratio = max(step.predicted_bytes, 1) / max(reference.predicted_bytes, 1)
    return w / max(ratio, 1 / ratio)


def effective_count(weights: Sequence[float]) -> float:
    """How many equal references these weights are worth (Kish's effective sample size)."""
    total = sum(weights)
    return total * total / sum(w * w for w in weights) if total > 0 else 0.0


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The value below which `q` of the weight lies (linear between the weighted midpoints)."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    target, seen = q * total, 0.0
    points = []
    for value, w in pairs:
        points.append((seen + w / 2, value))
        seen += w
    if target <= points[0][0]:
        return points[0][1]
    for (c0, v0), (c1, v1) in itertools.pairwise(points):
        if target <= c1:
            return v0 + (v1 - v0) * (target - c0) / (c1 - c0)
    return points[-1][1]


def similar_band(step: StepTraits, references: Sequence[ReferenceStep]) -> tuple[int, float, float] | None:
    """(effective references, under, over) for this step, widened by `SIMILAR_MARGIN`; None when the references
    are too few or too unlike it to say."""
    if not references:
        return None
    weights = [weight(step, r) for r in references]
    count = effective_count(weights)
    if count < MIN_EFFECTIVE_STEPS:
        return None
    errors = [r.error for r in references]
    low = weighted_quantile(errors, weights, LOW_QUANTILE)
    high = weighted_quantile(errors, weights, HIGH_QUANTILE)
    return math.floor(count), min(0.0, low) - SIMILAR_MARGIN, max(0.0, high) + SIMILAR_MARGIN
