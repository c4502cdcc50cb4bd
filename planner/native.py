"""The compiled core: the planner's hottest modules, compiled by mypyc from their own Python source.

mypyc turns these typed modules into a C extension (`setup.py` builds it on install). The Python
source stays the one definition of the semantics: the compiled modules are the same code, and every
test runs against them when they are built. Python falls back to the source, whole, when

- `SPMD_PLANNER_PURE=1` is set (the reference run),
- nothing was compiled (no C compiler, or an install that skipped it), or
- any compiled module's source changed since the build (an edit not yet rebuilt: `make native`).

All or nothing: compiled modules call each other directly inside one shared library, so one stale
module would keep running its old code through the others.

This module imports nothing from the planner: `setup.py` reads `MODULES` from it before the planner
can be imported.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# Module paths relative to the repository root, compiled together.
MODULES: tuple[str, ...] = (
    "planner/hlo/ir/tuple_leaves.py",
    "planner/sharding/tile_assignment.py",
    "planner/sharding/hlo_sharding.py",
    "planner/sharding/algebra.py",
    "planner/sharding/merge.py",
    "planner/sharding/reshape.py",
    "planner/propagation/shared/graph.py",
    "planner/propagation/gspmd/context.py",
    "planner/propagation/shared/dot_dims.py",
    "planner/propagation/gspmd/gather_scatter.py",
    "planner/propagation/gspmd/forward_common.py",
    "planner/propagation/gspmd/forward_tuples.py",
    "planner/propagation/gspmd/forward_shapes.py",
    "planner/propagation/gspmd/forward_dot.py",
    "planner/propagation/gspmd/forward_reductions.py",
    "planner/propagation/gspmd/forward.py",
    "planner/propagation/gspmd/backward.py",
    "planner/propagation/gspmd/worklist.py",
    "planner/propagation/gspmd/outputs.py",
    "planner/propagation/gspmd/driver.py",
    "planner/memory/buffers.py",
    "planner/memory/dot_partition.py",
    "planner/memory/communication.py",
    "planner/memory/conversions.py",
    "planner/memory/values.py",
    "planner/memory/schedule.py",
    "planner/memory/model.py",
    "planner/memory/timeline.py",
)
# What the build records: the digest of the sources it compiled.
STAMP = "native_build.json"
PURE_VARIABLE = "SPMD_PLANNER_PURE"

_ROOT = Path(__file__).resolve().parent.parent


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def source_digest(root: Path = _ROOT, modules: Sequence[str] = MODULES) -> str:
    """One hash over every compiled module's path and bytes."""
    h = hashlib.sha256()
    for path in modules:
        h.update(path.encode())
        h.update(b"\0")
        h.update((root / path).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def write_stamp(root: Path = _ROOT, digest: str | None = None) -> None:
    """Called by the build once it succeeded: the digest of the sources it compiled (taken before it began)."""
    stamp = {"digest": digest or source_digest(root), "modules": list(MODULES)}
    (root / "planner" / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")


def _compiled_file(path: str) -> Path | None:
    source = _ROOT / path
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def _why_source() -> str | None:
    """None when the compiled modules are current; otherwise why the source runs instead."""
    if os.environ.get(PURE_VARIABLE) == "1":
        return f"{PURE_VARIABLE}=1"
    missing = [p for p in MODULES if _compiled_file(p) is None]
    if missing:
        return "not compiled" if len(missing) == len(MODULES) else f"{missing[0]} was not compiled"
    stamp_path = _ROOT / "planner" / STAMP
    try:
        stamp = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        return f"no readable build stamp ({stamp_path.name})"
    if stamp.get("modules") != list(MODULES) or stamp.get("digest") != source_digest():
        return "the source changed since the build (rebuild with `make native`)"
    return None


class _SourceFinder:
    """Finds the compiled modules' Python source ahead of their extension files."""

    def __init__(self) -> None:
        self.paths = {module_name(p): _ROOT / p for p in MODULES}

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.paths.get(name)
        return importlib.util.spec_from_file_location(name, source) if source is not None else None


_reason: str | None = None
_selected = False


def select() -> None:
    """Decides once, before any compiled module is imported, which of the two runs."""
    global _reason, _selected
    if _selected:
        return
    _selected = True
    _reason = _why_source()
    if _reason is not None:
        sys.meta_path.insert(0, _SourceFinder())


def status() -> str:
    """`compiled`, or `source: <why>`: what this process runs."""
    if not _selected:
        return "not selected yet"
    return "compiled" if _reason is None else f"source: {_reason}"


def is_compiled() -> bool:
    return _selected and _reason is None
