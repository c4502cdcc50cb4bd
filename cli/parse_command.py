"""`spmd-planner parse [FILE] [--json]`: read a module and summarise it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cli.arguments import add_module_file, source_name
from planner.data import DEFAULT_DUMP
from planner.hlo.structure.summary import render_summary, summarize
from planner.hlo.text.parser import parse_hlo, read_hlo_text


def register(sub: Any) -> None:
    p = sub.add_parser("parse", help="parse HLO text and print a summary of the module")
    add_module_file(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path: Path = args.file or DEFAULT_DUMP
    text = read_hlo_text(path)
    summary = summarize(parse_hlo(text, source=source_name(path)), len(text.encode()))
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print(render_summary(summary))
    return 0
