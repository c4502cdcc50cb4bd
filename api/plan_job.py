"""One plan, in a child process: a job as JSON on stdin, the plan (or the error) as JSON on stdout.

Bad input is an answer, not a crash: parse errors come back with their line
and column and status 422. Only a real crash leaves a non-zero exit code.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from typing import Any

from planner.errors import TOO_DEEP, HloParseError, PlannerError
from planner.hlo.text.parser import parse_hlo
from planner.hlo.text.printer import print_module
from planner.mesh import Mesh
from planner.passes import Planning, Preparation
from planner.plan.manifest import Manifest


def plan_job(job: dict[str, Any]) -> dict[str, Any]:
    try:
        module = parse_hlo(job["hlo"], source=job["source"])
        mesh = Mesh(**{k: tuple(v) for k, v in job["mesh"].items()}) if job.get("mesh") else None
        manifest = Manifest.model_validate(job["manifest"]) if job.get("manifest") else None
        prepared = Preparation(job.get("chip") or "cpu", mesh, libtpu=job.get("libtpu")).apply(module)
        planning = Planning(job.get("capacity_bytes"), job["threshold"], job["min_bytes"], manifest, job["verify"])
        plan, patched = planning.apply(prepared)
    except HloParseError as e:
        return {"status": 422, "message": str(e), "line": e.line, "column": e.column}
    except (PlannerError, ValueError) as e:
        return {"status": 422, "message": str(e)}
    except RecursionError:
        return {"status": 422, "message": TOO_DEEP}
    return {"plan_json": plan.model_dump_json(), "patched": print_module(patched)}


def main() -> None:
    # One job, then this process exits: collecting the plan's garbage (about 8% of a plan) would only
    # free memory the exit frees anyway.
    gc.disable()
    job = json.load(sys.stdin)
    json.dump(plan_job(job), sys.stdout)
    sys.stdout.flush()
    # The answer is written: tearing the interpreter down object by object (a plan's heap and every
    # imported module, about 50 ms) would only delay the server's reading of it.
    os._exit(0)


if __name__ == "__main__":
    main()
