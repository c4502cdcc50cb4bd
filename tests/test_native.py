"""The compiled core is what the tests run, and the Python source it is compiled from says the same.

`make test` builds the core (planner/native.py) before the suite, so every fidelity test here runs
against the compiled modules; this file checks that, and runs the source (SPMD_PLANNER_PURE=1) on
every corpus step to show the two agree instruction by instruction and byte by byte.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, corpus_hlo_files

from planner import native

# Every propagated sharding and the memory model's totals (XLA:CPU and a TPU chip) per corpus step.
_SNAPSHOT = """
import json, sys
from pathlib import Path
from planner import native
from planner.hlo.text.parser import parse_hlo
from planner.memory import memory_report
from planner.prepare import prepare
from planner.propagation import propagate

out = {"status": native.status(), "steps": {}}
for path in sys.argv[1:]:
    module = parse_hlo(Path(path).read_text())
    shardings = {}
    totals = {}
    for b in ("cpu", "v6e"):
        result = propagate(prepare(module, b))
        shardings[b] = {i.name: i.sharding.to_text() if i.sharding is not None else None for i in result.instructions}
        totals[b] = memory_report(prepare(module, b), result=result).total_bytes
    out["steps"][Path(path).name] = {"shardings": shardings, "totals": totals}
print(json.dumps(out))
"""


def _snapshot(pure: bool) -> dict:
    env = {**os.environ, native.PURE_VARIABLE: "1" if pure else "0"}
    files = [str(p) for p in corpus_hlo_files()]
    done = subprocess.run([sys.executable, "-c", _SNAPSHOT, *files], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_suite_runs_the_compiled_core() -> None:
    if os.environ.get(native.PURE_VARIABLE) == "1":
        assert native.status() == f"source: {native.PURE_VARIABLE}=1"
        return
    assert native.is_compiled(), f"the tests would run the Python source instead: {native.status()}"
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for path in native.MODULES:
        module = importlib.import_module(native.module_name(path))
        assert module.__file__ is not None and module.__file__.endswith(suffixes), module.__file__


def test_source_and_compiled_core_agree_on_every_corpus_step() -> None:
    compiled, source = _snapshot(pure=False), _snapshot(pure=True)
    assert source["status"] == f"source: {native.PURE_VARIABLE}=1"
    assert compiled["status"] == native.status()
    assert len(source["steps"]) == len(corpus_hlo_files()) >= 10
    for name, expected in source["steps"].items():
        got = compiled["steps"][name]
        assert got["totals"] == expected["totals"], name
        differing = [k for k, v in expected["shardings"].items() if got["shardings"].get(k) != v]
        assert not differing and got["shardings"].keys() == expected["shardings"].keys(), (name, differing[:5])


@pytest.mark.parametrize(
    ("setting", "digest", "reason"),
    [
        ("1", None, "SPMD_PLANNER_PURE=1"),
        ("0", "0" * 64, "the source changed since the build"),
    ],
    ids=["asked_for_source", "edited_since_build"],
)
def test_source_runs_when_asked_or_when_the_build_is_stale(
    monkeypatch: pytest.MonkeyPatch, setting: str, digest: str | None, reason: str
) -> None:
    monkeypatch.setenv(native.PURE_VARIABLE, setting)
    if digest is not None:
        if not native.is_compiled():
            pytest.fail(f"no current build to make stale: {native.status()}")
        monkeypatch.setattr(native, "source_digest", lambda *a: digest)
    why = native._why_source()
    assert why is not None and why.startswith(reason), why


def test_the_build_stamp_names_what_was_compiled() -> None:
    stamp = json.loads((REPO / "planner" / native.STAMP).read_text())
    assert stamp["modules"] == list(native.MODULES)
    assert len(stamp["digest"]) == 64
