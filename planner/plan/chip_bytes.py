"""Bytes per chip, written in JSON as one entry per distinct value: 256 equal chips are one line, not 256.

In Python a plan keeps `{"0": n0, "1": n1, ...}` (chip id -> bytes). In JSON it is grouped by value, the
chips of each value as inclusive id ranges, fullest first:

    {"0": 100, "1": 100, "2": 100, "3": 90}  ->  [{"bytes": 100, "chips": [[0, 2]]}, {"bytes": 90, "chips": [[3, 3]]}]

Serializing with `context={"every_chip": True}` writes the dict itself (the service's `every_chip=true`,
the CLI's `--every-chip`); reading takes either form, so plans stored before grouping still read.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, PlainSerializer, SerializationInfo, WithJsonSchema

from planner.mesh import MAX_DEVICES


class ChipBytesGroup(BaseModel):
    bytes: int = Field(description="bytes per chip")
    chips: list[tuple[int, int]] = Field(description="the chips holding them, as inclusive id ranges [first, last]")


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def grouped(per_chip: dict[str, int]) -> list[dict[str, Any]]:
    by_bytes: dict[int, list[int]] = {}
    for chip, n in per_chip.items():
        by_bytes.setdefault(n, []).append(int(chip))
    return [{"bytes": n, "chips": [list(r) for r in _runs(ids)]} for n, ids in sorted(by_bytes.items(), reverse=True)]


def _to_json(per_chip: dict[str, int], info: SerializationInfo) -> Any:
    context = info.context if isinstance(info.context, dict) else {}
    return dict(per_chip) if context.get("every_chip") else grouped(per_chip)


def _from_json(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    expanded: dict[str, int] = {}
    for item in value:
        group = ChipBytesGroup.model_validate(item)
        for first, last in group.chips:
            if last < first or last - first >= MAX_DEVICES:
                raise ValueError(f"chip range [{first}, {last}] is empty or larger than any mesh")
            expanded.update((str(c), group.bytes) for c in range(first, last + 1))
    return expanded


_SCHEMA = {
    "anyOf": [
        {"type": "array", "items": ChipBytesGroup.model_json_schema()},
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "description": "with every_chip: chip id -> bytes",
        },
    ]
}
PerChipBytes = Annotated[
    dict[str, int],
    BeforeValidator(_from_json),
    PlainSerializer(_to_json, when_used="json"),
    WithJsonSchema(_SCHEMA, mode="serialization"),
]
