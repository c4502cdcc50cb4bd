"""`spmd-planner search MODULE:FUNCTION --devices N --axes fsdp,tp [...]`: which configuration of a JAX step fits.

FUNCTION is a step builder, `build(candidate, mesh) -> (loss_fn, params, batch)` (see
`planner.search.evaluate`). Every mesh factorization of N over the axes x remat x microbatches x chip is
planned on Ray (local unless `--ray-address`), ranked, and the best `--top` compiled by the chip's
compiler. Needs jax and ray (the `xla` and `search` extras).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import Any

from planner.units import format_bytes


def register(sub: Any) -> None:
    p = sub.add_parser("search", help="find the mesh, remat and microbatch configuration of a JAX step that fits")
    p.add_argument("builder", metavar="MODULE:FUNCTION", help="the step builder, importable from here")
    p.add_argument("--devices", type=int, required=True, help="chip count the meshes factor")
    p.add_argument("--axes", default="fsdp,tp", help="mesh axis names, major to minor (default: fsdp,tp)")
    p.add_argument("--remat", default="none", help="remat policies the builder knows, comma-separated")
    p.add_argument("--microbatches", default="1", help="microbatch counts, comma-separated")
    p.add_argument("--chip", default="v6e", help="chip presets, comma-separated (default: v6e)")
    p.add_argument("--top", type=int, default=3, help="how many of the best to compile (default: 3)")
    p.add_argument("--ray-address", help="a Ray cluster (default: a local Ray on this machine)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all)")
    p.add_argument("--url", help="store the ranking on the planner service there and print its dashboard page")
    p.add_argument("--token", help="the service's bearer token, when it asks for one")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for package, extra in (("jax", "xla"), ("ray", "search")):
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"search needs {package}, which is not installed: pip install 'spmd-planner[{extra}]'")
    from planner.search.candidates import candidate_grid, remat_policies
    from planner.search.evaluate import load_builder
    from planner.search.ranking import post_report, report_body, search, terminal_progress
    from planner.wire import PlannerRefused, PlannerUnavailable

    if args.top < 0:
        raise ValueError(f"--top {args.top} must be >= 0")
    remats = remat_policies(args.remat.split(","))
    try:
        microbatches = [int(k) for k in args.microbatches.split(",")]
    except ValueError:
        raise ValueError(f"--microbatches {args.microbatches!r} is not a list of counts") from None
    candidates = candidate_grid(args.devices, args.axes.split(","), remats, microbatches, args.chip.split(","))
    report = search(load_builder(args.builder), candidates, top_k=args.top, ray_address=args.ray_address,
                    num_cpus=args.num_cpus, progress=terminal_progress)  # fmt: skip
    print(f"{len(report.ranked)} candidates, ranked (fits first, then fewer dot FLOPs per device for the global "
          "batch, then headroom):")  # fmt: skip
    print(f"{'#':>3}  {'candidate':46s} {'predicted':>11} {'headroom':>11} {'GFLOP/dev':>12} {'compiled':>22}")
    for i, e in enumerate(report.ranked, 1):
        if e.error is not None:
            print(f"{i:>3}  {e.candidate.label():46s} failed: {_first_line(e.error)}")
            continue
        c = report.confirmation(e.candidate)
        compiled = ""
        if c is not None and c.compiled_bytes is not None:
            compiled = f"{format_bytes(c.compiled_bytes)} {c.compiler}"
        elif c is not None:
            compiled = f"failed: {_first_line(c.error or '')}"
        predicted, headroom = format_bytes(e.predicted_after_bytes or 0), format_bytes(e.headroom_bytes or 0)
        gflops = (e.flops_per_batch or 0) / 1e9
        print(f"{i:>3}  {e.candidate.label():46s} {predicted:>11} {headroom:>11} {gflops:>12,.1f} {compiled:>22}")
    stored = True
    if args.url:
        try:
            print(f"dashboard: {post_report(args.url, report_body(report, args.builder), args.token)}")
        except (PlannerRefused, PlannerUnavailable) as failure:
            print(f"spmd-planner: the ranking above was not stored: {failure}", file=sys.stderr)
            stored = False
    best = report.best()
    if best is None:
        print("no candidate is predicted to fit")
        return 1
    confirmed = report.best_confirmed()
    if confirmed is not None:
        e, c = confirmed
        used, capacity = format_bytes(c.compiled_bytes or 0), format_bytes(e.capacity_bytes or 0)
        print(f"best: {e.candidate.label()}, confirmed by {c.compiler}: {used} of {capacity}")
    elif not report.confirmed:
        print(f"best: {best.candidate.label()}, predicted (none compiled)")
    else:
        print(f"best: {best.candidate.label()}, predicted; no compiled candidate fits (compile more with --top)")
    return 0 if stored else 2


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
