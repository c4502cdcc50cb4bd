"""Generated input through the CLI and the service answers with a located error or a plan: no traceback,
no 5xx. CI runs a seeded 400; `bench/fuzz_surfaces.py --inputs 10000` is the benchmark run (bench/RESULTS.md)."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import fuzz_surfaces


def test_four_hundred_generated_inputs_answer_without_traceback_or_5xx() -> None:
    tally = fuzz_surfaces.run(400, seed=7)
    assert tally.failures == [], "\n\n".join(tally.failures[:5])
    answers = tally.answers
    # Both surfaces saw both outcomes: plans and located refusals.
    assert answers["cli: exit 0"] > 0 and answers["cli: exit 2"] > 0
    assert answers["service: HTTP 200"] > 0 and answers["service: HTTP 422"] > 0
    assert sum(answers.values()) == 400


def test_each_mutation_changes_real_text() -> None:
    import random

    seed = fuzz_surfaces.seeds()[-1]
    for mutation in fuzz_surfaces.MUTATIONS:
        changed = any(mutation(random.Random(k), seed) != seed for k in range(5))
        assert changed, mutation.__name__
