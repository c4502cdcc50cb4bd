"""Byte counts for people: one unit policy for the CLI, the dashboard and the plan's own sentences.

Binary units, chosen per magnitude so the number before the unit stays under 1,024: 729,190.4 MiB
is printed 712.1 GiB, 1,536 bytes 1.5 KiB, 12 bytes 12 B. Parsing (`32GiB`, `80GB`) is
`planner.memory.chips.parse_bytes`.
"""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def format_bytes(num_bytes: int) -> str:
    """`712.1 GiB`: one decimal in the largest binary unit that keeps the number at least 1 (B up to 1,023).

    The sign is kept (a negative margin is `-3.2 GiB`). A value that would round up to 1,024.0 of a unit
    is printed in the next one (1,048,575 bytes is `1.0 MiB`, not `1024.0 KiB`).
    """
    sign = "-" if num_bytes < 0 else ""
    n = abs(num_bytes)
    if n < 1024:
        return f"{sign}{n} B"
    value, unit = float(n), "B"
    for unit in _UNITS:
        value /= 1024
        if round(value, 1) < 1024 or unit == _UNITS[-1]:
            break
    return f"{sign}{value:,.1f} {unit}"
