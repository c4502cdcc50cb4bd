"""Where an instruction came from: source file and line from its metadata.

Older dumps write `source_file=... source_line=...` in the metadata; newer
XLA writes `stack_frame_id=N`, resolved through the module's StackFrames,
FileLocations and FileNames tables (innermost frame first).
"""

from __future__ import annotations

import re

from planner.hlo.ir import HloModule, Instruction

_FIELD = re.compile(r"(\w+)=(\d+)")


def source_location(module: HloModule, inst: Instruction) -> str | None:
    """`file:line (op_name)` for `inst`, or None when the dump does not say."""
    metadata = inst.metadata
    if metadata is None:
        return None
    op = metadata.op_name
    where = None
    if metadata.source_file:
        where = f"{metadata.source_file}:{metadata.source_line}"
    else:
        frame = metadata.get("stack_frame_id")
        if frame is not None and frame.isdigit():
            where = _frame_location(module, int(frame))
    if where is None:
        return op
    return f"{where} ({op})" if op else where


def _frame_location(module: HloModule, frame: int) -> str | None:
    tables = {name: dict(entries) for name, entries in module.debug_tables}
    frames, locations, files = (
        tables.get("StackFrames", {}),
        tables.get("FileLocations", {}),
        tables.get("FileNames", {}),
    )
    entry = frames.get(frame)
    if entry is None:
        return None
    location = locations.get(int(dict(_FIELD.findall(entry)).get("file_location_id", 0)))
    if location is None:
        return None
    fields = dict(_FIELD.findall(location))
    name = files.get(int(fields.get("file_name_id", 0)), '"?"').strip('"')
    return f"{name}:{fields.get('line', '?')}"
