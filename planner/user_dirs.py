"""Where the project keeps files on the user's machine: under the XDG cache directory, one folder per use.

`XDG_CACHE_HOME`, else `~/.cache`, then `spmd-planner/NAME`: the client's plans (`plans`) and the
reference compiles (`fidelity`) live there, outside any work tree, so a fresh checkout finds them.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spmd-planner" / name
