"""Builds the compiled core (see planner/native.py): the listed modules, compiled by mypyc.

Everything else about the package lives in pyproject.toml. Without a C compiler, or with
SPMD_PLANNER_PURE=1 at install time, the package installs as pure Python and runs the same code.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def native_extensions() -> list:
    native = runpy.run_path(str(ROOT / "planner" / "native.py"))
    if os.environ.get(native["PURE_VARIABLE"]) == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("mypyc is not installed: the planner installs as pure Python", file=sys.stderr)
        return []
    native["write_stamp"](ROOT)
    try:
        return mypycify(list(native["MODULES"]), opt_level="3", group_name="planner_native")
    except (Exception, SystemExit) as e:  # mypyc refuses code it cannot type: say so, install the source
        print(f"the compiled core was not built ({e}): the planner runs as pure Python", file=sys.stderr)
        return []


class OptionalBuildExt(build_ext):
    """A machine without a working C compiler still gets the planner, as pure Python."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # the compiler's own error is printed above; say what it means
            print(f"the compiled core was not built ({e}): the planner runs as pure Python", file=sys.stderr)


setup(ext_modules=native_extensions(), cmdclass={"build_ext": OptionalBuildExt})
