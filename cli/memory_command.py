"""`spmd-planner memory FILE --mesh fsdp=4,tp=2 [--chip v6e | --hbm 32GiB] [--backend cpu|v6e|...] [--json]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cli.arguments import add_module_mesh_and_capacity, capacity_of, source_name
from planner.data import DEFAULT_DUMP
from planner.hlo.text.parser import parse_hlo, read_hlo_text
from planner.memory import memory_report, render_memory
from planner.passes import Preparation
from planner.plan.diagnosis.peak_holders import holder_names
from planner.propagation import propagate
from planner.targets import BACKENDS


def register(sub: Any) -> None:
    p = sub.add_parser("memory", help="predict HBM per chip after sharding propagation")
    add_module_mesh_and_capacity(p)
    p.add_argument(
        "--top", type=int, default=10, help="how many of the buffers holding the peak to list, largest first"
    )
    p.add_argument(
        "--backend",
        default=None,
        choices=list(BACKENDS),
        help="the compiler to predict: cpu (XLA:CPU, as --verify compiles) or a chip preset (its XLA:TPU); "
        "default: --chip's, else cpu",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path: Path = args.file or DEFAULT_DUMP
    module = parse_hlo(read_hlo_text(path), source=source_name(path))
    try:
        # Like `plan --chip`: a chip preset predicts that chip's compiler unless --backend says otherwise.
        backend = args.backend or args.chip or "cpu"
        prepared = Preparation(backend, args.mesh, libtpu=args.libtpu).apply(module)
        result = propagate(prepared)
        # Stacked gradients named as the plan names them (`gradient of params['w_down']`).
        report = memory_report(prepared, capacity_of(args), args.top, result, names=holder_names(prepared, result))
    except ValueError as e:
        print(f"spmd-planner: {e}", file=sys.stderr)
        return 2
    for warning in prepared.warnings:
        print(f"spmd-planner: warning: {warning}", file=sys.stderr)
    print(json.dumps(report.to_json(), indent=1) if args.json else render_memory(report))
    return 0
