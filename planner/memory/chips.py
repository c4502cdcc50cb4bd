"""Accelerator presets: HBM per chip, and byte-count parsing (`32GiB`, `80GB`).

A TPU preset's bytes are what XLA:TPU lets one program hold on the chip, not the chip's HBM: a v6e has
32 GiB, and XLA:TPU refuses a step needing more than 31.24 GiB of it with its compile-time out-of-memory
error ("exceeds available HBM (31.24G)"). Measured with libtpu 0.0.50 by compiling, ahead of time, a
step of one f32 argument and one output of its size, the largest total (argument + output + temp -
alias) that compiles, to 32 KiB (tests/test_chip_capacity.py holds each preset at that edge).
TPU v4 keeps its chip's 32 GiB: libtpu's ahead-of-time v4 topology describes one device per
TensorCore (15.25 GiB available each), where a v4 in JAX runs both cores as one device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.units import format_bytes

GIB = 1 << 30
# HBM per chip beyond 1 PiB is refused: the largest chips hold under 200 GB, so a capacity five thousand
# times that is a unit slip (`80TB` typed for `80GB`), and every step would "fit" it.
MAX_HBM_BYTES = 1 << 50


@dataclass(frozen=True, slots=True)
class Chip:
    name: str
    hbm_bytes: int
    description: str


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip("v4", 32 * GIB, "TPU v4: 32 GiB HBM2"),
        Chip("v5e", 16_909_074_432, "TPU v5e: 16 GiB HBM2e, 15.75 GiB of it available to a program"),
        Chip("v5p", 102_786_400_256, "TPU v5p: 95 GiB HBM2e, 95.73 GiB of it available to a program"),
        Chip("v6e", 33_545_781_248, "TPU v6e (Trillium): 32 GiB HBM, 31.24 GiB of it available to a program"),
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


def check_hbm_bytes(hbm_bytes: int, given: str | None = None) -> int:
    """HBM per chip as a user gave it, returned when it is more than 0 bytes and at most 1 PiB
    (`MAX_HBM_BYTES`); `given` is how they wrote it (`1000000TB`), for the message."""
    if hbm_bytes <= 0:
        raise ValueError(f"HBM per chip must be more than 0 bytes, got {hbm_bytes if given is None else repr(given)}")
    shown = given if given is not None else f"{hbm_bytes:,} bytes"
    if hbm_bytes > MAX_HBM_BYTES:
        raise ValueError(
            f"HBM per chip of {shown} ({format_bytes(hbm_bytes)}) is more than 1 PiB, far beyond any chip "
            "(the largest hold under 200 GB): a unit slip? (e.g. 80GB, 32GiB)"
        )
    return hbm_bytes


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
