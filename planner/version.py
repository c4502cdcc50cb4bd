"""The planner's version, for keys of stored plans: the package version and a digest of its code.

A plan is a function of its request and of the planner that made it. Stored and cached plans are
keyed by both, so a planner that changed (a released version, or code edited in place during
development, which keeps the version number) never serves a plan its predecessor made.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


@cache
def planner_version() -> str:
    """`0.1.0+3f9c2a1b4d5e`: the distribution's version and the first 12 hex digits of its sources' digest."""
    try:
        released = version("spmd-planner")
    except PackageNotFoundError:
        released = "0+unknown"
    digest = hashlib.sha256()
    for source in sorted(_PACKAGE.rglob("*.py")):
        digest.update(source.relative_to(_PACKAGE).as_posix().encode())
        digest.update(source.read_bytes())
    return f"{released}+{digest.hexdigest()[:12]}"
