"""A sweep's rows kept for a sweep on another stack, so that one table holds both.

The two JAX stacks live in two environments (jax 0.12 needs Python 3.12; torch_xla 2.9 pins jax 0.7.1),
so no one process compiles on both. `python -m fidelity.sweep --save-rows FILE` keeps one stack's rows
with the name of that stack; `--beside FILE` in the other stack's sweep puts them in its table: the cases
this stack does not measure (torch_xla's, on the stack torch_xla pins) as rows of their own, and the
compiler's bytes on the other stack beside each case both measured.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fidelity.sweep import Row


def stack_name() -> str:
    """The front ends and compilers this environment compiles with, as the tables name them."""
    parts = []
    for package in ("jax", "libtpu", "torch_xla"):
        try:
            parts.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return ", ".join(parts) or "no compiler installed"


@dataclass(frozen=True)
class StackRows:
    stack: str
    rows: tuple[Row, ...]

    def by_case(self) -> dict[tuple[str, str], Row]:
        """Each row by (case name, compiler: "cpu" or "tpu")."""
        return {(r.case.name, r.compiler): r for r in self.rows}


def save_rows(path: Path, rows: list[Row]) -> None:
    path.write_bytes(pickle.dumps({"stack": stack_name(), "rows": list(rows)}))


def load_rows(path: Path) -> StackRows:
    """Rows another sweep saved. Pickle, read by the same checkout's classes: a file from an older checkout
    whose rows no longer load is refused with what to do."""
    try:
        saved = pickle.loads(path.read_bytes())
        return StackRows(stack=str(saved["stack"]), rows=tuple(saved["rows"]))
    except (OSError, pickle.UnpicklingError, AttributeError, KeyError, TypeError, EOFError) as e:
        problem = f"{path}: not rows a sweep of this checkout saved ({e}); save them again with --save-rows"
        raise ValueError(problem) from e
