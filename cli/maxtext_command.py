"""`spmd-planner maxtext [CONFIG] KEY=VALUE ...`: plan MaxText's train step in MaxText's terms.

Takes what MaxText's `train_compile` takes (a config file, else MaxText's base.yml, and its overrides; one of them
`compile_topology=`), lowers the step as `train_compile` builds it without compiling it, and plans it for that
topology's chip: the verdict, what holds the peak by MaxText's parameter names, findings, and next steps as
MaxText overrides, each predicted, with the `train_compile` command that confirms one. Runs where MaxText is
installed (`make maxtext-env` makes such an environment).
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from cli.arguments import libtpu_arg
from cli.terminal_progress import terminal_progress
from scan_runtime.maxtext.next_steps import next_steps
from scan_runtime.maxtext.planning import MaxTextPlan, plan_maxtext
from scan_runtime.maxtext.report import render


def register(sub: Any) -> None:
    p = sub.add_parser(
        "maxtext",
        help="plan MaxText's train step for a TPU topology, in MaxText's terms (takes train_compile's arguments)",
    )
    p.add_argument(
        "arguments",
        nargs="*",
        metavar="[CONFIG] KEY=VALUE",
        help="as train_compile takes them: a config file (default: MaxText's base.yml), then overrides, "
        "compile_topology=v6e-8 among them",
    )
    p.add_argument(
        "--libtpu", type=libtpu_arg, help="the libtpu release the step is compiled with (default: installed)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON (the engine's terms)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("maxtext") is None:
        raise ValueError("maxtext is not installed here: run this in your MaxText environment (make maxtext-env)")
    with terminal_progress():
        planned = plan_maxtext(args.arguments, args.libtpu)
        if args.json:
            print(planned.plan.model_dump_json(indent=1))
            return 0
        steps = [] if _fits(planned) else next_steps(planned, lambda a: plan_maxtext(a, args.libtpu, holders=False))
    for warning in planned.plan.warnings:
        print(f"spmd-planner: warning: {warning}")
    print("\n".join(render(planned, steps)))
    return 0


def _fits(planned: MaxTextPlan) -> bool:
    verdict = planned.plan.verdict
    return verdict is not None and verdict.call_after == "fits"
