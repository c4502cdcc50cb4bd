"""transformers' decoder layers through the drop-in `scan_layers`, with the model's own forward.

Each run is a subprocess (`hf_scan_driver.py`): torch_xla SPMD on 8 virtual CPU devices is set once
per process. The scanned model must give the loss and gradients of the model's own loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")
pytest.importorskip("transformers")

DRIVER = Path(__file__).with_name("hf_scan_driver.py")


def _run(family: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DRIVER), family, mode], capture_output=True, text=True, timeout=900)


@pytest.mark.xla
@pytest.mark.parametrize("family", ["llama", "gemma", "mixtral"])
def test_scanned_decoder_layers_train_as_the_models_own_loop(family: str) -> None:
    results = {}
    for mode in ("plain", "scan"):
        done = _run(family, mode)
        assert done.returncode == 0, done.stderr[-3000:]
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    plain, scanned = results["plain"], results["scan"]
    assert scanned["num_grads"] == plain["num_grads"]
    assert scanned["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert scanned["grad_sum"] == pytest.approx(plain["grad_sum"], rel=1e-5)


@pytest.mark.xla
def test_layers_given_different_masks_are_refused() -> None:
    done = _run("gemma2", "scan")
    assert done.returncode != 0
    assert "layers are of 2 kinds (full_attention, sliding_attention)" in done.stderr
