"""Where an instruction came from: source file and line from its metadata, and the name the user's code gave it.

Older dumps write `source_file=... source_line=...` in the metadata; newer
XLA writes `stack_frame_id=N`, resolved through the module's StackFrames,
FileLocations and FileNames tables (innermost frame first).
"""

from __future__ import annotations

import re

from planner.hlo.ir.module import HloModule, Instruction

_FIELD = re.compile(r"(\w+)=(\d+)")
# op_name components that say how the user's code was traced, not what it computes.
_WRAPPERS = re.compile(
    r"^(?:(?:jvp|transpose|vmap|pmap|remat\d*|checkpoint|custom_jvp_call|custom_vjp_call\w*|shard_map|pjit|xla_call)"
    r"\(.*\)|while|body|cond|closed_call|scan|remat|checkpoint)$"
)
_JIT = re.compile(r"^jit\((.*)\)$")
# HLO text escapes quotes inside strings: `op_name="params[\\'wq\\']"`.
_ESCAPE = re.compile(r"\\(.)")


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


def short_op_name(op_name: str | None) -> str | None:
    """The user-meaningful part of an op_name: tracing wrappers and the top-level `jit(...)` dropped.

    `jit(train_step)/transpose(jvp())/while/body/jit(silu)` -> `silu`;
    `params['wq']` stays `params['wq']`.
    """
    if not op_name:
        return None
    parts = _split_path(_ESCAPE.sub(r"\1", op_name))
    if len(parts) > 1 and _JIT.match(parts[0]):
        parts = parts[1:]
    kept = []
    for part in parts:
        if _WRAPPERS.match(part):
            continue
        m = _JIT.match(part)
        kept.append(m.group(1) if m else part)
    return "/".join(kept) or None


def _split_path(op_name: str) -> list[str]:
    """`a/b(c/d)/e['f/g']` -> `a`, `b(c/d)`, `e['f/g']`: slashes inside brackets or quotes do not split."""
    parts, depth, quote, start = [], 0, "", 0
    for i, c in enumerate(op_name):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "/" and depth == 0:
            parts.append(op_name[start:i])
            start = i + 1
    parts.append(op_name[start:])
    return [p for p in parts if p]
