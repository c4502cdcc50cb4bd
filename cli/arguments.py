"""Arguments several commands share: the input file, the mesh and the chip's capacity."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from planner.data import DEFAULT_DUMP
from planner.memory import CHIPS, chip, parse_byte_count
from planner.memory.chips import check_hbm_bytes
from planner.mesh import Mesh
from planner.targets import LIBTPU_RELEASE


def mesh_arg(text: str) -> Mesh:
    try:
        return Mesh.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def chip_arg(text: str) -> str:
    try:
        return chip(text).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def libtpu_arg(text: str) -> str:
    """A libtpu release as pip names it (`0.0.52`, `0.0.50.1`)."""
    if not re.fullmatch(LIBTPU_RELEASE, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a libtpu release (like 0.0.52)")
    return text


def bytes_arg(text: str) -> int:
    """A byte count with its unit (`32GiB`, `80GB`, `512MiB`); a bare number other than 0 is refused."""
    try:
        return parse_byte_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def capacity_arg(text: str) -> int:
    """HBM per chip: a byte count with its unit, more than zero (a chip with no memory fits nothing) and at
    most 1 PiB (more is a unit slip: `check_hbm_bytes`)."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"HBM per chip must be more than 0 bytes, got {text!r}")
    try:
        return check_hbm_bytes(bytes_arg(text), text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_module_file(p: Any) -> None:
    """The optional FILE every command that reads a module takes."""
    default = f"default: the bundled {DEFAULT_DUMP.name}"
    p.add_argument("file", nargs="?", type=Path, help=f"HLO text file, plain or gzip; - for stdin ({default})")


def source_name(path: Path) -> str:
    """How messages name the input: its path, or <stdin> for `-`."""
    return "<stdin>" if str(path) == "-" else str(path)


def add_module_mesh_and_capacity(p: Any) -> None:
    """FILE, --mesh, and --chip | --hbm (read back as `args.chip if args.chip is not None else args.hbm`)."""
    add_module_file(p)
    p.add_argument("--mesh", type=mesh_arg, help="mesh axes major to minor, e.g. fsdp=4,tp=2")
    capacity = p.add_mutually_exclusive_group()
    capacity.add_argument("--chip", type=chip_arg, help=f"chip preset: {', '.join(CHIPS)}")
    capacity.add_argument("--hbm", type=capacity_arg, help="HBM per chip, e.g. 32GiB or 80GB")
    p.add_argument(
        "--libtpu",
        type=libtpu_arg,
        help="the libtpu release the step is compiled with, e.g. 0.0.52 (default: the installed one, else the newest "
        "modelled): its passes, memory rules and the references the verdict is drawn from",
    )


def capacity_of(args: argparse.Namespace) -> int | None:
    return chip(args.chip).hbm_bytes if args.chip is not None else args.hbm  # type: ignore[no-any-return]
