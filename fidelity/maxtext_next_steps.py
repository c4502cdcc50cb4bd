"""The MaxText front's next steps, applied as the overrides it prints and compiled by MaxText's own `train_compile`.

    python -m fidelity.maxtext_next_steps NAME --out DIR [CONFIG] KEY=VALUE ...

Runs in the environment `make maxtext-env` makes, with the project on PYTHONPATH. Plans the step and its
next steps as `spmd-planner maxtext` does (each next step is MaxText's step lowered with its overrides and planned);
then compiles each predicted one for the topology ahead of time with MaxText's `train_compile`
(`fidelity.run_maxtext`, one process each: XLA reads its flags once) and records what XLA:TPU needed per chip
beside what the plan predicted. `NAME.json` holds the step's MaxText facts and, per next step, its overrides, the
predicted bytes and verdict, and XLA:TPU's; `NAME.hlo.gz` the step as lowered and
`NAME.nextK.hlo.gz` the step lowered with those overrides
(`lowered.as_text(dialect="hlo", debug_info=True)`), so its plan can be made again where MaxText is not installed
(tests/test_maxtext_front.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import subprocess
import sys
from pathlib import Path

from fidelity.memory_stats import reference_bytes
from planner.memory import CHIPS
from scan_runtime.maxtext.next_steps import MaxTextNextStep
from scan_runtime.maxtext.terms import MaxTextStep, with_overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("arguments", nargs="*", metavar="[CONFIG] KEY=VALUE")
    args = parser.parse_intermixed_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from scan_runtime.maxtext.next_steps import next_steps
    from scan_runtime.maxtext.planning import plan_maxtext

    planned = plan_maxtext(args.arguments, holders=False)
    if planned.plan.verdict is None or planned.plan.verdict.call_after == "fits":
        raise SystemExit(f"{args.name}: the step is planned to fit: it has no next steps to confirm")
    assert planned.hlo is not None
    (args.out / f"{args.name}.hlo.gz").write_bytes(gzip.compress(planned.hlo.encode()))
    capacity = CHIPS[planned.step.chip].hbm_bytes
    steps: list[dict] = []
    for step in next_steps(planned, lambda a: plan_maxtext(a, holders=False)):
        # Each candidate the search planned, the ones that did not fit before the one reported.
        for candidate in (*step.tried, step):
            name = f"{args.name}.next{len(steps)}"
            steps.append(_confirmed(args.out, name, planned.step, candidate, capacity, candidate is step))
    record = {
        "name": args.name,
        "maxtext": {**dataclasses.asdict(planned.step), "config": "maxtext/configs/base.yml"},
        "total_bytes": planned.plan.hbm.total_after,
        "call": planned.plan.verdict.call_after if planned.plan.verdict is not None else None,
        "next_steps": steps,
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _confirmed(
    out: Path, name: str, maxtext: MaxTextStep, step: MaxTextNextStep, capacity: int, reported: bool
) -> dict:
    """The candidate as planned and, when it was, as XLA:TPU compiles it; `reported`: the one the report gives."""
    entry: dict = {"kind": step.kind, "overrides": list(step.overrides), "predicted_bytes": step.total_bytes,
                   "predicted_call": step.call, "reported": reported}  # fmt: skip
    if step.total_bytes is not None and step.hlo is not None:
        (out / f"{name}.hlo.gz").write_bytes(gzip.compress(step.hlo.encode()))
        compiled = _compile(out, name, maxtext, list(step.overrides))
        needs, _ = reference_bytes(compiled)
        entry |= {"hlo": f"{name}.hlo.gz", "libtpu": compiled["libtpu"], "xla_bytes": needs,
                  "xla_fits": needs <= capacity, "compile_seconds": compiled["compile_seconds"]}  # fmt: skip
    predicted, xla = (step.total_bytes or 0) / 2**30, entry.get("xla_bytes", 0) / 2**30
    print(f"{name}: {step.kind} {' '.join(step.overrides)}: predicted {predicted:.2f} GiB ({step.call}), "
          f"XLA:TPU {xla:.2f} GiB (fits: {entry.get('xla_fits')})")  # fmt: skip
    return entry


def _compile(out: Path, name: str, step: MaxTextStep, extra: list[str]) -> dict:
    """`fidelity.run_maxtext` on the user's step with `extra` in place of the user's same keys."""
    values = dict(o.split("=", 1) for o in with_overrides(step, extra)[1:])
    # run_maxtext names the run, its output directory and one slice itself.
    for own in ("run_name", "base_output_directory"):
        values.pop(own, None)
    if values.pop("compile_topology_num_slices", "1") != "1":
        raise ValueError(f"{name}: fidelity.run_maxtext compiles one slice; the step asks for more")
    model, topology = values.pop("model_name"), values.pop("compile_topology")
    command = [sys.executable, "-m", "fidelity.run_maxtext", name, "--out", str(out), "--model", model,
               "--topology", topology] + [f"--set={k}={v}" for k, v in values.items()]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / f"{name}.xla.json").read_text())  # type: ignore[no-any-return]


if __name__ == "__main__":
    sys.exit(main())
