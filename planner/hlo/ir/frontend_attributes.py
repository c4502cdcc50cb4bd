"""`frontend_attributes={key="value", key={...}}`, with Shardy's `xla.sdy.*` values typed.

As in XLA's parser, a key is an attribute name (dots allowed: `xla.sdy.meshes`)
and a value is a quoted string or a brace-balanced group, kept as text
(`xla.sdy.meshes={mesh = #sdy.mesh<["fsdp"=4, "tp"=2]>}`). The Shardy values
the planner uses are read when the module is parsed, so a malformed one is an
error at its line and column rather than a surprise during planning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from planner.scanner import Cursor, skip_balanced
from planner.sharding.shardy import (
    SdyMesh,
    ShardyTextError,
    TensorSharding,
    parse_group_id,
    parse_manual_axes,
    parse_meshes,
    parse_sharding,
)

MESHES = "xla.sdy.meshes"
SHARDING = "xla.sdy.sharding"
GROUP_ID = "xla.sdy.sharding_group_id"
# A shard_map's, on its round-trip custom calls (`GlobalToLocalShape`, `LocalToGlobalShape`).
IN_SHARDINGS = "xla.sdy.in_shardings"
OUT_SHARDINGS = "xla.sdy.out_shardings"
MANUAL_AXES = "xla.sdy.manual_axes"

# How each typed value is read.
_READERS = {
    MESHES: parse_meshes,
    SHARDING: parse_sharding,
    GROUP_ID: parse_group_id,
    IN_SHARDINGS: parse_sharding,
    OUT_SHARDINGS: parse_sharding,
    MANUAL_AXES: parse_manual_axes,
}

_KEY = re.compile(r"[A-Za-z_][\w.\-]*")


@dataclass(frozen=True, slots=True)
class FrontendAttributes:
    """The key/value pairs as written (strings unquoted), plus the Shardy values read from them."""

    items: tuple[tuple[str, str], ...]
    sdy_meshes: dict[str, SdyMesh] | None = field(default=None, compare=False)
    sdy_sharding: tuple[TensorSharding, ...] | None = field(default=None, compare=False)
    sdy_group: int | None = field(default=None, compare=False)
    sdy_in_shardings: tuple[TensorSharding, ...] | None = field(default=None, compare=False)
    sdy_out_shardings: tuple[TensorSharding, ...] | None = field(default=None, compare=False)
    sdy_manual_axes: tuple[str, ...] | None = field(default=None, compare=False)

    def get(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.items:
            if k == key:
                return v
        return default

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def read_frontend_attributes(cursor: Cursor) -> FrontendAttributes:
    cursor.expect("{", "to open frontend_attributes={...}")
    items: list[tuple[str, str]] = []
    typed: dict[str, object] = {}
    if not cursor.try_literal("}"):
        while True:
            key = cursor.match(_KEY, "an attribute name").group(0)
            cursor.expect("=", f"after frontend attribute '{key}'")
            start = cursor.skip_space()
            if cursor.peek() == '"':
                quoted = cursor.parse_string()
                value, offsets = _unquote(quoted, start)
            elif cursor.peek() == "{":
                skip_balanced(cursor, f"frontend attribute '{key}'")
                value = cursor.text[start : cursor.pos]
                offsets = None
            else:
                cursor.fail(f"expected a quoted string or {{...}} as the value of '{key}', found "
                            f"{cursor.describe_next()}")  # fmt: skip
            if key in _READERS:
                typed[key] = _read_sdy(cursor, key, value, start, offsets)
            items.append((key, value))
            if cursor.try_literal("}"):
                break
            cursor.expect(",", "or '}' in frontend_attributes")
    return FrontendAttributes(
        tuple(items),
        typed.get(MESHES),  # type: ignore[arg-type]
        typed.get(SHARDING),  # type: ignore[arg-type]
        typed.get(GROUP_ID),  # type: ignore[arg-type]
        typed.get(IN_SHARDINGS),  # type: ignore[arg-type]
        typed.get(OUT_SHARDINGS),  # type: ignore[arg-type]
        typed.get(MANUAL_AXES),  # type: ignore[arg-type]
    )


def _read_sdy(cursor: Cursor, key: str, value: str, start: int, offsets: list[int] | None) -> object:
    try:
        return _READERS[key](value)
    except ShardyTextError as e:
        at = start + e.offset if offsets is None else offsets[min(e.offset, len(offsets) - 1)]
        cursor.fail(f"bad Shardy value for {key}: {e}", at)


def _unquote(quoted: str, start: int) -> tuple[str, list[int]]:
    """The string's text with escapes resolved, and each character's position in the file."""
    chars: list[str] = []
    offsets: list[int] = []
    i = 1
    body_end = len(quoted) - 1
    while i < body_end:
        if quoted[i] == "\\" and i + 1 < body_end:
            escaped = quoted[i + 1]
            chars.append({"n": "\n", "t": "\t"}.get(escaped, escaped))
            offsets.append(start + i)
            i += 2
        else:
            chars.append(quoted[i])
            offsets.append(start + i)
            i += 1
    offsets.append(start + body_end)
    return "".join(chars), offsets
