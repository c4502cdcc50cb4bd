"""Shardy's propagation lit files from a copy of openxla/shardy the user provides (`SHARDY_SRC`).

The copy is a git clone (with or without a work tree) or a plain directory of the sources (an
unpacked archive). From a clone, the files are read at the newest commit of its HEAD not later than a
given time (a jaxlib's release), so a clone newer than the release still checks the tests that
release was built with; a plain directory is read as it is, its commit unknown.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# The propagation tests, as Shardy lays them out (`.../propagation/test`, `.../propagation/debugging/test`).
TEST_ROOT = "shardy/dialect/sdy/transforms/propagation"


@dataclass(frozen=True)
class ShardySource:
    path: Path
    commit: str | None  # None: a plain directory
    commit_time: datetime | None = None

    def describe(self) -> str:
        if self.commit is None:
            return f"{self.path} (a plain directory: commit unknown)"
        when = self.commit_time.date().isoformat() if self.commit_time else "?"
        return f"openxla/shardy@{self.commit[:8]} ({when})"


def _git(path: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True)
    return done.stdout


def is_git(path: Path) -> bool:
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True, text=True)
    return done.returncode == 0


def open_source(path: Path, not_after: datetime | None) -> ShardySource:
    """The commit to read: HEAD's newest not later than `not_after` (HEAD itself without a time)."""
    if not path.exists():
        raise ValueError(f"SHARDY_SRC={path} does not exist")
    if not is_git(path):
        return ShardySource(path, None)
    args = ["log", "-1", "--first-parent", "--format=%H %cI"]
    if not_after is not None:
        args.append(f"--before={not_after.isoformat()}")
    line = _git(path, *args, "HEAD").strip()
    if not line:
        raise ValueError(f"{path} has no commit on HEAD before {not_after}")
    commit, when = line.split()
    return ShardySource(path, commit, datetime.fromisoformat(when))


def lit_files(source: ShardySource) -> list[tuple[str, str]]:
    """(path in the repository, text) of every `test/*.mlir` under the propagation tests."""
    if source.commit is None:
        paths = sorted(p.relative_to(source.path).as_posix() for p in (source.path / TEST_ROOT).rglob("*.mlir"))
        paths = [p for p in paths if p.split("/")[-2] == "test"]
        return [(p, (source.path / p).read_text()) for p in paths]
    listed = _git(source.path, "ls-tree", "-r", "--name-only", source.commit, "--", TEST_ROOT).split()
    paths = sorted(p for p in listed if p.endswith(".mlir") and p.split("/")[-2] == "test")
    return [(p, _git(source.path, "show", f"{source.commit}:{p}")) for p in paths]
