"""Which calls XLA:TPU's first call inliner keeps: compile small steps ahead of time and look.

    python -m fidelity.tpu_call_inliner_probe [--topology v6e:2x2] [--sites 2] [--shape chain|params|nested] N ...

Each probe is one step that calls a jitted callee at `--sites` call sites (each on its own operand, so no
pass can merge the sites), the callee `N` instructions long with its parameters and root:
- `chain`: one parameter, then N - 1 elementwise ops;
- `params`: (N + 1) / 2 parameters summed by (N - 1) / 2 adds (N odd);
- `nested`: one parameter, a call of an inner callee of one call site, then elementwise ops, sized so the
  callee holds N instructions once the inner call is inlined into it.
XLA:TPU compiles the step for the topology with no TPU attached, dumping its module after `call-inliner`.
The probe reports how many of the step's calls that pass left, and what `tpu_inlineable` (the planner's
model of the pass) says of the step's HLO, read from `lowered.as_text(dialect="hlo")`.

Prints one JSON object per line: {"shape", "instructions", "sites", "kept_by_xla", "kept_by_planner"}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner import parse_hlo
from planner.hlo.structure.tpu_call_inliner import tpu_inlineable

SHAPES = ("chain", "params", "nested")


@dataclass(frozen=True)
class Probe:
    shape: str
    instructions: int
    sites: int
    kept_by_xla: int
    kept_by_planner: int

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _step(shape: str, instructions: int, sites: int) -> Any:
    """The step: `sites` calls of a callee of `instructions` instructions."""
    import jax
    import jax.numpy as jnp

    if shape == "params":
        if instructions % 2 == 0:
            raise ValueError("a callee of summed parameters has an odd number of instructions")
        count = (instructions + 1) // 2

        @jax.jit
        def summed(*xs: Any) -> Any:
            total = xs[0]
            for x in xs[1:]:
                total = total + x
            return total

        def step(x: Any) -> Any:
            return sum(summed(*[x * float(2 + site * count + j) for j in range(count)]) for site in range(sites))

        return step
    if shape == "nested":
        # Once inlined, the inner callee (a parameter and `inner` cosines) adds `inner` instructions.
        inner = (instructions - 1) // 2
        outer = instructions - 1 - inner

        @jax.jit
        def inner_callee(x: Any) -> Any:
            for _ in range(inner):
                x = jnp.cos(x)
            return x

        @jax.jit
        def nested(x: Any) -> Any:
            x = inner_callee(x)
            for _ in range(outer):
                x = jnp.sin(x)
            return x

        return lambda x: sum(nested(x * float(site + 2)) for site in range(sites))

    @jax.jit
    def chain(x: Any) -> Any:
        for _ in range(instructions - 1):
            x = jnp.sin(x)
        return x

    return lambda x: sum(chain(x * float(site + 2)) for site in range(sites))


def probe(shape: str, instructions: int, sites: int = 2, topology: str = "v6e:2x2") -> Probe:
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies

    device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
    operand = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    lowered = jax.jit(_step(shape, instructions, sites)).lower(operand)
    hlo = lowered.as_text(dialect="hlo")
    module = parse_hlo(hlo)
    which = tpu_inlineable(module)
    planner_kept = sum(1 for comp in module.computations for inst in comp if inst.opcode == "call" and not which(inst))
    dump = Path(tempfile.mkdtemp(prefix="tpu-call-inliner-"))
    try:
        lowered.compile({"xla_dump_to": str(dump), "xla_dump_hlo_pass_re": "call-inliner"})
        # The first inliner, before the X64 rewriter (later pipelines run the pass again, and XLA compiles
        # helper modules of its own beside the step).
        step_name = hlo.split()[1].rstrip(",")
        after = sorted(p for p in dump.glob(f"*.{step_name}.*.txt") if ".after_call-inliner." in p.name)
        if not after:
            raise RuntimeError(f"no dump after call-inliner in {dump}")
        xla_kept = len(re.findall(r"\scall\(", after[0].read_text()))
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    return Probe(shape, instructions, sites, xla_kept, planner_kept)


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m fidelity.tpu_call_inliner_probe", description=summary)
    parser.add_argument("instructions", type=int, nargs="+", help="the callee's instruction counts to probe")
    parser.add_argument("--topology", default="v6e:2x2")
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--shape", choices=SHAPES, default="chain")
    args = parser.parse_args(argv)
    # libtpu loads once per machine unless told otherwise: the test suites run beside other compiles.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    for count in args.instructions:
        print(json.dumps(probe(args.shape, count, args.sites, args.topology).as_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
