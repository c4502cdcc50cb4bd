"""Accelerator presets: HBM per chip, and byte-count parsing (`32GiB`, `80GB`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Chip:
    name: str
    hbm_bytes: int
    description: str


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip("v4", 32 * GIB, "TPU v4: 32 GiB HBM2"),
        Chip("v5e", 16 * GIB, "TPU v5e: 16 GiB HBM2e"),
        Chip("v5p", 95 * GIB, "TPU v5p: 95 GiB HBM2e"),
        Chip("v6e", 32 * GIB, "TPU v6e (Trillium): 32 GiB HBM"),
        Chip("h100", 80 * 10**9, "NVIDIA H100 SXM: 80 GB HBM3"),
        Chip("h200", 141 * 10**9, "NVIDIA H200: 141 GB HBM3e"),
    )
}

_BYTES = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.I)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip


def chip(name: str) -> Chip:
    try:
        return CHIPS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown chip {name!r}; known: {', '.join(CHIPS)}") from None


def parse_byte_count(text: str) -> int:
    """A byte count a person typed: `32GiB`, `80GB`, `512MiB`, `0`. A bare number other than 0 is refused:
    `32` read as 32 bytes is never what was meant (an API field named `*_bytes` takes a plain integer)."""
    n = text.strip()
    if n.replace(".", "", 1).isdigit() and float(n) != 0:
        raise ValueError(f"{text!r} needs a unit: {n}GiB, {n}GB, {n}MiB or {n}B")
    try:
        return parse_bytes(n)
    except ValueError:
        # Not parse_bytes's own message: it offers a bare byte count, which is refused here.
        raise ValueError(f"bad byte count {text!r}: expected a number and a unit, e.g. 32GiB or 80GB") from None


def parse_bytes(text: str) -> int:
    """`32GiB` -> 34359738368; a bare number is bytes."""
    m = _BYTES.fullmatch(text)
    if m is None:
        raise ValueError(f"bad byte count {text!r}: expected e.g. 32GiB, 80GB or 17179869184")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
