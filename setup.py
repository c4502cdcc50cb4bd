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
# The digest of the sources this build compiles, recorded once it succeeds.
_BUILT: dict[str, str] = {}


def native_extensions() -> list:
    native = runpy.run_path(str(ROOT / "planner" / "native.py"))
    if os.environ.get(native["PURE_VARIABLE"]) == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("mypyc is not installed: the planner installs as pure Python", file=sys.stderr)
        return []
    # Until this build succeeds, whatever an earlier build left must not pass for these sources; the
    # digest is taken now, so an edit made while it compiles is not claimed by it.
    _forget_stamp()
    _BUILT["digest"] = native["source_digest"](ROOT)
    try:
        return mypycify(list(native["MODULES"]), opt_level="3", group_name="planner_native")
    except (Exception, SystemExit) as e:  # mypyc refuses code it cannot type: say so, install the source
        print(f"the compiled core was not built ({e}): the planner runs as pure Python", file=sys.stderr)
        return []


def _forget_stamp() -> None:
    """Without a stamp naming these sources the planner runs its Python source (`planner/native.py`)."""
    native = runpy.run_path(str(ROOT / "planner" / "native.py"))
    (ROOT / "planner" / native["STAMP"]).unlink(missing_ok=True)


class OptionalBuildExt(build_ext):
    """A machine without a working C compiler still gets the planner, as pure Python."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # the compiler's own error is printed above; say what it means
            print(f"the compiled core was not built ({e}): the planner runs as pure Python", file=sys.stderr)
            return
        if self.extensions and "digest" in _BUILT:
            # The compiled modules now are these sources: say so, for `planner/native.py` to check, in the
            # source tree and, for a wheel, beside the compiled modules (build_py copied the package first).
            write_stamp = runpy.run_path(str(ROOT / "planner" / "native.py"))["write_stamp"]
            write_stamp(ROOT, _BUILT["digest"])
            if not self.inplace:
                write_stamp(Path(self.build_lib), _BUILT["digest"])


setup(ext_modules=native_extensions(), cmdclass={"build_ext": OptionalBuildExt})
