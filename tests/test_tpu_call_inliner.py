"""XLA:TPU's first call inliner keeps large callees of several call sites as calls.

The model (`planner.hlo.structure.tpu_call_inliner`) is checked two ways: on small HLO modules whose
callees sit either side of the measured edge (20 instructions, parameters and root counted, inner calls
inlined first), and against libtpu itself, which compiles probe steps ahead of time for v6e and dumps its
module after the pass (`fidelity.tpu_call_inliner_probe`; every libtpu the project installs: 0.0.20 with
torch_xla's stack, 0.0.50 and 0.0.52 with today's jax).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from planner import parse_hlo
from planner.hlo.structure.tpu_call_inliner import KEPT_SHARED_CALLEE_SIZE, tpu_inlineable
from planner.prepare import prepare


def _module(callee_ops: int, sites: int, inner_ops: int = 0) -> str:
    """A step calling `callee` at `sites` sites; the callee is a parameter and `callee_ops` negates, after a
    call of an inner callee (a parameter and `inner_ops` negates) when `inner_ops` is given."""
    lines = ["HloModule probe, num_partitions=1", ""]
    if inner_ops:
        lines += ["inner {", "  p = f32[8] parameter(0)"]
        lines += [f"  i{k} = f32[8] negate({'p' if k == 0 else f'i{k - 1}'})" for k in range(inner_ops)]
        lines += ["}", ""]
    lines += ["callee {", "  x = f32[8] parameter(0)"]
    previous = "x"
    if inner_ops:
        lines.append("  in = f32[8] call(x), to_apply=inner")
        previous = "in"
    for k in range(callee_ops):
        lines.append(f"  c{k} = f32[8] negate({previous})")
        previous = f"c{k}"
    # Each site on its own argument: two calls of one callee on one operand are one call to CSE.
    lines += ["}", "", "ENTRY main {"] + [f"  a{k} = f32[8] parameter({k})" for k in range(sites)]
    lines += [f"  s{k} = f32[8] call(a{k}), to_apply=callee" for k in range(sites)]
    total = "s0"
    for k in range(1, sites):
        lines.append(f"  t{k} = f32[8] add({total}, s{k})")
        total = f"t{k}"
    lines += [f"  ROOT r = f32[8] copy({total})", "}"]
    return "\n".join(lines) + "\n"


def _kept(text: str) -> int:
    module = parse_hlo(text)
    which = tpu_inlineable(module)
    return sum(1 for comp in module.computations for inst in comp if inst.opcode == "call" and not which(inst))


def test_a_shared_callee_of_20_instructions_is_kept_and_of_19_inlined() -> None:
    assert KEPT_SHARED_CALLEE_SIZE == 20
    assert _kept(_module(callee_ops=19, sites=2)) == 2  # a parameter and 19 ops
    assert _kept(_module(callee_ops=18, sites=2)) == 0
    assert _kept(_module(callee_ops=19, sites=3)) == 3


def test_a_callee_of_one_call_site_is_inlined_at_any_size() -> None:
    assert _kept(_module(callee_ops=200, sites=1)) == 0


def test_a_callee_is_sized_with_its_own_calls_inlined() -> None:
    # callee: x, the call, 9 ops; inner: p, 9 ops. Inlined: x, 9 + 9 ops = 19 instructions, then 20.
    assert _kept(_module(callee_ops=9, sites=2, inner_ops=9)) == 0
    assert _kept(_module(callee_ops=10, sites=2, inner_ops=9)) == 2


def test_xla_tpus_pipeline_keeps_the_calls_and_xla_cpus_inlines_them() -> None:
    text = _module(callee_ops=30, sites=2)
    tpu = prepare(parse_hlo(text), "v6e")
    cpu = prepare(parse_hlo(text), "cpu")
    calls = {name: [i for c in p.module.computations for i in c if i.opcode == "call"] for name, p in
             (("tpu", tpu), ("cpu", cpu))}  # fmt: skip
    assert len(calls["tpu"]) == 2 and not calls["cpu"]
    # One computation per call site (flatten-call-graph), so each site propagates on its own.
    assert len({i.called_computations[0] for i in calls["tpu"]}) == 2
    record = next(r for r in tpu.passes if r.name == "call-inliner")
    assert "2 kept as calls of shared callees" in record.summary


def _libtpu_installed() -> bool:
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


PROBES = [
    # (shape, instructions, sites): either side of the edge, for each way of reaching it.
    ("chain", 19, 2), ("chain", 20, 2), ("params", 19, 2), ("params", 21, 2),
    ("nested", 19, 2), ("nested", 20, 2), ("chain", 40, 1), ("chain", 20, 3),
]  # fmt: skip


@pytest.mark.xla
@pytest.mark.skipif(not _libtpu_installed(), reason="needs libtpu, which compiles the probes for v6e")
def test_the_model_keeps_the_calls_libtpu_keeps() -> None:
    results = []
    for shape, instructions, sites in PROBES:
        argv = [sys.executable, "-m", "fidelity.tpu_call_inliner_probe", "--shape", shape, "--sites", str(sites),
                str(instructions)]  # fmt: skip
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        results += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(PROBES)
    kept_by_xla = [r["kept_by_xla"] for r in results]
    assert kept_by_xla == [0, 2, 0, 2, 0, 2, 0, 3]
    assert [r["kept_by_planner"] for r in results] == kept_by_xla


_LOOP_CALLEE = """HloModule loops, num_partitions=1

cond {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[8] negate(x)
  ROOT t = (s32[], f32[8]) tuple(j, y)
}

callee {
  x = f32[8] parameter(0)
NEGATES
  z = s32[] constant(0)
  init = (s32[], f32[8]) tuple(z, c17)
  w = (s32[], f32[8]) while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(w), index=1
}

ENTRY main {
  a0 = f32[8] parameter(0)
  a1 = f32[8] parameter(1)
  s0 = f32[8] call(a0), to_apply=callee
  s1 = f32[8] call(a1), to_apply=callee
  ROOT r = f32[8] add(s0, s1)
}
""".replace("NEGATES", "\n".join(f"  c{k} = f32[8] negate({'x' if k == 0 else f'c{k - 1}'})" for k in range(18)))


def test_a_kept_callees_copies_hold_its_loop_once_as_xlas_partitioned_module_does() -> None:
    """Two call sites of a kept callee are two copies here (one per site, flatten-call-graph) and one
    function in XLA's partitioned module: their loops, alike, are counted once."""
    from fidelity.agreement import one_per_function
    from planner.propagation import propagate

    prepared = prepare(parse_hlo(_LOOP_CALLEE), "v6e")
    result = propagate(prepared)
    loops = [i for i in result.instructions if i.opcode == "while"]
    shapes = {i.name: i.shape for c in prepared.module.computations for i in c}
    assert len(loops) == 2
    assert len(one_per_function(loops, shapes)) == 1
    # On XLA:CPU every call is inlined: the two loops are two loops of one computation.
    cpu = prepare(parse_hlo(_LOOP_CALLEE), "cpu")
    cpu_loops = [i for i in propagate(cpu).instructions if i.opcode == "while"]
    cpu_shapes = {i.name: i.shape for c in cpu.module.computations for i in c}
    assert len(one_per_function(cpu_loops, cpu_shapes)) == 2
