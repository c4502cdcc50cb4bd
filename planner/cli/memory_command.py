"""`spmd-planner memory FILE --mesh fsdp=4,tp=2 [--chip v6e | --hbm 32GiB] [--json]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from planner.data import DEFAULT_DUMP
from planner.hlo.parser import parse_hlo, read_hlo_text
from planner.memory import CHIPS, chip, memory_report, parse_bytes, render_memory
from planner.mesh import Mesh


def register(sub: Any) -> None:
    p = sub.add_parser("memory", help="predict HBM per chip after sharding propagation")
    p.add_argument("file", nargs="?", type=Path, help=f"HLO text file (default: the bundled {DEFAULT_DUMP.name})")
    p.add_argument("--mesh", type=mesh_arg, help="mesh axes major to minor, e.g. fsdp=4,tp=2")
    capacity = p.add_mutually_exclusive_group()
    capacity.add_argument("--chip", type=chip_arg, help=f"chip preset: {', '.join(CHIPS)}")
    capacity.add_argument("--hbm", type=bytes_arg, help="HBM per chip, e.g. 32GiB or 80GB")
    p.add_argument("--top", type=int, default=10, help="how many of the largest live buffers to list")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def mesh_arg(text: str) -> Mesh:
    try:
        return Mesh.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def chip_arg(text: str) -> int:
    try:
        return chip(text).hbm_bytes
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def bytes_arg(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    path: Path = args.file or DEFAULT_DUMP
    module = parse_hlo(read_hlo_text(path), source=str(path))
    capacity = args.chip if args.chip is not None else args.hbm
    try:
        report = memory_report(module, args.mesh, capacity, args.top)
    except ValueError as e:
        print(f"spmd-planner: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=1) if args.json else render_memory(report))
    return 0
