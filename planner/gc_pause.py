"""Python's cycle collector, paused while the planner builds and drops large object graphs.

Propagation and the memory model allocate hundreds of thousands of small objects (shardings,
provenance, buffers) beside the long-lived IR. Every few hundred allocations the collector scans
the young objects, and every few thousand a full pass walks the whole IR: a fifth of a plan's time,
to find cycles the planner frees anyway when the plan is done (the working graphs' operand/user
links are its only cycles). Pausing it for the duration of one call and collecting on the way out
keeps peak memory bounded by one plan's garbage.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collection_paused() -> Iterator[None]:
    """Pauses the cycle collector inside the block (nested blocks are free) and collects once after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(1)
