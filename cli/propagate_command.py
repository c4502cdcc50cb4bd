"""`spmd-planner propagate FILE [--backend cpu|v6e|...] [--json] [--explain NAME]`: simulate GSPMD propagation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cli.arguments import add_module_file, source_name
from planner.data import DEFAULT_DUMP
from planner.hlo.text.parser import parse_hlo, read_hlo_text
from planner.passes import Preparation, ShardingPropagation
from planner.propagation import PropagationOptions, PropagationResult
from planner.targets import BACKENDS


def register(sub: Any) -> None:
    p = sub.add_parser("propagate", help="simulate XLA's sharding propagation and print every instruction's sharding")
    add_module_file(p)
    p.add_argument("--no-spmd", action="store_true", help="non-SPMD semantics (no combining of partial shardings)")
    p.add_argument("--allow-output", type=_bools, metavar="BOOLS",
                   help="propagate to outputs, one flag or one per output (e.g. true or true,false); "
                   "default: the module header's allow_spmd_sharding_propagation_to_output")  # fmt: skip
    p.add_argument("--allow-parameters", type=_bools, metavar="BOOLS", help="likewise for entry parameters")
    p.add_argument(
        "--backend",
        default="cpu",
        choices=list(BACKENDS),
        help="whose pipeline prepares the module: cpu (XLA:CPU) or a chip preset (its XLA:TPU's passes run first; "
        "instructions those passes remove or add are absent or new); default cpu",
    )
    p.add_argument("--json", action="store_true", help="print {instruction: sharding} as JSON")
    p.add_argument("--explain", metavar="NAME", help="print the chain of decisions behind one instruction's sharding")
    p.set_defaults(run=run)


def _bools(text: str) -> tuple[bool, ...]:
    words = {"true": True, "1": True, "false": False, "0": False}
    try:
        return tuple(words[w.strip().lower()] for w in text.split(","))
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true/false flags separated by commas, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    path: Path = args.file or DEFAULT_DUMP
    module = parse_hlo(read_hlo_text(path), source=source_name(path))
    options = PropagationOptions.from_module(module, is_spmd=not args.no_spmd)
    if args.allow_output is not None:
        options = PropagationOptions(options.is_spmd, args.allow_output, options.allow_to_parameters)
    if args.allow_parameters is not None:
        options = PropagationOptions(options.is_spmd, options.allow_to_output, args.allow_parameters)
    result = ShardingPropagation().apply(Preparation(args.backend, options=options).apply(module))
    if args.explain:
        return _explain(result, args.explain)
    if args.json:
        print(
            json.dumps({i.name: i.sharding.to_text() for i in result.instructions if i.sharding is not None}, indent=1)
        )
        return 0
    width = max(len(i.name) for i in result.instructions)
    for inst in result.instructions:
        sharding = inst.sharding.to_text() if inst.sharding is not None else "-"
        print(f"{inst.computation}  {inst.name:<{width}}  {sharding}")
    unknown = result.unknown
    if unknown:
        print(f"\n{len(unknown)} instruction(s) not modelled (left without an inferred sharding):")
        for name, reason in unknown.items():
            print(f"  {name}: {reason}")
    return 0


def _explain(result: PropagationResult, name: str) -> int:
    if name not in result:
        print(f"spmd-planner: no instruction named {name!r}", file=sys.stderr)
        return 2
    for depth, step in enumerate(result.explain(name)):
        inst = step.instruction
        rule = inst.provenance.rule if inst.provenance else "no sharding"
        level = inst.provenance.aggressiveness if inst.provenance else -1
        when = f" (aggressiveness {level})" if level >= 0 else ""
        sharding = step.sharding.to_text() if step.sharding is not None else "-"
        element = f" element {step.element}" if step.element is not None else ""
        pad = "  " * depth
        print(f"{pad}{inst.name}{element} [{inst.opcode}] {sharding}\n{pad}  <- {rule}{when}")
    return 0
