"""A step XLA:TPU refuses is a reference too: its out-of-memory error read in both of libtpu's spellings, recorded
by the runners, counted by the sweep and the bench as what the step needs (`fidelity.memory_stats`)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from fidelity.generate import summary
from fidelity.memory_stats import hbm_oom, reference_bytes
from fidelity.sweep import compiler_bytes

GIB = 2**30
FIXTURES = REPO / "tests" / "fixtures" / "maxtext"
# libtpu 0.0.52 refusing the JAX grid's 405B step without remat on v5p-128, as jax raised it.
TEMPORARIES = (
    "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
    "memory required for HLO temporaries (244.25G) exceeds available HBM (95.73G). HLO module: jit_train_step.\n"
    "See https://openxla.org/xla/errors/error_1000 for more details."
)


def test_a_refusal_is_read_in_binary_units() -> None:
    oom = hbm_oom(TEMPORARIES)
    assert oom is not None
    assert (oom["needed_bytes"], oom["available_bytes"]) == (round(244.25 * GIB), round(95.73 * GIB))
    assert oom["message"].startswith("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED")


@pytest.mark.parametrize(
    "record",
    ["libtpu_0_0_52/maxtext_llama3.1-405b_L126_v6e-256_shardy", "maxtext_mixtral-8x7b_L16_v5p-8_shardy"],
)
def test_the_refusals_runners_recorded_read_again_to_the_same_bytes(record: str) -> None:
    """MaxText's refused steps (libtpu 0.0.52 and 0.0.50.1): their recorded message reads to the recorded bytes."""
    oom = json.loads((FIXTURES / f"{record}.xla.json").read_text())["tpu"]["oom"]
    again = hbm_oom(oom["message"])
    assert again is not None
    assert (again["needed_bytes"], again["available_bytes"]) == (oom["needed_bytes"], oom["available_bytes"])


def test_any_other_compile_error_is_not_a_refusal() -> None:
    assert hbm_oom("INVALID_ARGUMENT: unsupported sharding on custom-call at line 3") is None


def _refused_record() -> dict:
    return {
        "name": "jax_llama405b_noremat_free_S1024_L126_fsdp64_tp4",
        "memory": {"total_bytes": 300 * GIB},
        "compile_seconds": 2.0,
        "opt_barrier_count": 0,
        "post_partition_while_shapes": [],
        "tpu": {"oom": hbm_oom(TEMPORARIES), "compile_seconds": 5.5, "post_partition_while_shapes": []},
    }


def test_a_refused_step_counts_as_what_it_needs_in_the_sweep_and_the_bench() -> None:
    record = _refused_record()
    assert reference_bytes(record) == (round(244.25 * GIB), False)
    assert compiler_bytes(record, "tpu") == round(244.25 * GIB)


def test_the_runners_summary_says_the_step_was_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "step.xla.json"
    path.write_text(json.dumps(_refused_record()))
    assert "XLA:TPU refuses it, needs 250,112.0 MiB" in summary(path, 7.0)
