"""What every task this project sends to Ray asks for: memory a node can give, and the driver's import path.

Both the configuration search's candidates and the service's jobs are Ray tasks; they ask the same way.
"""

from __future__ import annotations

import os
import sys


def task_memory(wanted_bytes: int) -> int:
    """`wanted_bytes` of Ray's memory resource, at most what the largest live node has: a task asking more
    than every node holds would wait for ever. Needs a connected Ray."""
    import ray

    largest = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)
    return min(wanted_bytes, int(largest)) or wanted_bytes


def driver_path() -> str:
    """The driver's import path (its directory first), as PYTHONPATH for a worker: what imports here
    (a step builder, the planner from a source tree) imports there."""
    return os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
