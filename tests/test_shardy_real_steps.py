"""Our Shardy engine against jaxlib's own Shardy passes, op by op, on real JAX steps (`fidelity.shardy_diff`).

Each fixture is the module XLA's Shardy pass propagates, as XLA:CPU dumps it
(`shardy/<module>/01.before_propagation.mlir`): a scanned Llama-like train step, fsdp=4 x tp=2. The truth
is computed here by the installed jaxlib's Shardy, so each fixture runs on the release that wrote it
(`tests/fixtures/shardy/*jax_0_7_1*` here, `*jax_0_12*` in `make test-jax-today`'s environment).
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from fidelity.shardy_diff import compare

FIXTURES = Path(__file__).parent / "fixtures" / "shardy"
RELEASE = "jax_0_12" if version("jax").startswith("0.12") else "jax_0_7_1"


@pytest.mark.xla
@pytest.mark.parametrize("path", sorted(FIXTURES.glob(f"*{RELEASE}.before_propagation.mlir")), ids=lambda p: p.stem)
def test_every_compared_value_equals_shardys(path: Path) -> None:
    result = compare(path, "sdy-propagation-pipeline")
    assert len(result.expected) > 250  # the ops the converter keeps named: most of the step
    wrong = {k: (result.expected[k], result.got.get(k)) for k in result.missed}
    assert not wrong, wrong
