"""Reference steps of the CI subset on today's JAX: run by `make test-jax-today` (jax 0.12 and its libtpu).

Each step is lowered by jax 0.12, compiled by its XLA:CPU on 8 virtual devices and by libtpu's XLA:TPU
ahead of time for its chip (`fidelity.references`, cached by content: the release is part of the key).
Planned from each form a user of that release hands over (XLA's dump as it writes it, NAME.hlo,
`as_text(dialect="hlo")`, `as_text()`), the plan must be the same, and as exact as on jax 0.7.1.
"""

from __future__ import annotations

import pytest

from fidelity.cases import CI_SUBSET, Case
from fidelity.references import ensure_references
from fidelity.sweep import Row, predict

pytestmark = pytest.mark.xla

# A GSPMD language model, a Shardy step in bf16 with remat, a GSPMD mixture of experts: the subset's
# three kinds of module, kept small for CI (the sweep runs the whole grid on this release).
NAMES = (
    "ci_jax_llama_lm_take_V8192_noremat_f32_gspmd_fsdp4_tp2_L4_D1024_free",
    "ci_jax_llama_full_bf16_shardy_fsdp2_tp4_L4_D1024_pinned",
    "ci_jax_moe_noremat_bf16_gspmd_fsdp4_tp2_L4_D1024_free",
)
CASES = [c for c in CI_SUBSET if c.name in NAMES]
# The bounds tests/test_fidelity_subset.py holds the same steps to on jax 0.7.1.
TOLERANCE = {"cpu": 0.29, "tpu": 0.42}


@pytest.fixture(scope="module")
def rows() -> dict[str, list[Row]]:
    assert len(CASES) == len(NAMES)
    failed = ensure_references(CASES, jobs=2)
    assert not failed, f"references failed to generate: {failed}"
    return {case.name: predict(case) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_form_plans_alike(case: Case, rows: dict[str, list[Row]]) -> None:
    assert [row.backend for row in rows[case.name]] == ["cpu", case.chip]
    for row in rows[case.name]:
        forms = {"lowered": row.lowered_agrees, "stablehlo": row.stablehlo_agrees, "dump": row.dump_agrees}
        assert forms == {"lowered": True, "stablehlo": True, "dump": True}, row.backend


@pytest.mark.parametrize("case", [c for c in CASES if c.partitioner == "gspmd"], ids=lambda c: c.name)
def test_gspmd_loops_are_partitioned_as_each_compiler_did(case: Case, rows: dict[str, list[Row]]) -> None:
    assert {row.backend: row.propagation for row in rows[case.name]} == {"cpu": "exact", case.chip: "exact"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hbm_per_chip_within_the_pinned_stack_s_bound(case: Case, rows: dict[str, list[Row]]) -> None:
    assert [row.backend for row in rows[case.name]] == ["cpu", case.chip]
    for row in rows[case.name]:
        assert abs(row.error) <= TOLERANCE[row.compiler], (
            f"{row.backend}: ours {row.ours_bytes / 2**20:.1f} MiB, compiler {row.compiler_bytes / 2**20:.1f} MiB "
            f"({row.error:+.1%})"
        )
