"""Full plan time against XLA's compile of the same module, for three steps users plan.

    .venv/bin/python bench/plan.py [--repeat N] [--no-tpu] [--no-per-mb] [--no-405b]

Steps: the bundled torch_xla dump (8 devices), the public JAX L=8 step (8 devices), and a
Llama-3.1-405B-shaped JAX step with remat on a 64x4 mesh (256 devices; a fidelity reference,
generated into the cache on first use). For each, in one run:

- our whole plan without verification (parse, inline, propagate, size memory, find, root-cause,
  build placements, re-simulate each; median of N, cold caches) and its number of simulations;
- propagation alone (parse + inline + one propagation; median of N);
- XLA's SPMD compile of the same text on virtual CPU devices, and where libtpu is installed the TPU
  compiler's ahead-of-time compile for a v6e slice of the same size, each in a child process
  (XLA reads its device count once per process);
- the ratios. Targets: plan <= 0.05x and propagation <= 0.02x of XLA:CPU's compile;
- XLA:CPU's own sharding-propagation pass, timed from XLA's pass log in a compile of its own, and
  what the plan would cost if each of its simulations cost that pass and nothing else did.

Then plan time per MB of HLO text over every corpus step: flat within +-30% of the median is the
target (a plan must not grow faster than the module).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from xla_reference import summary  # noqa: E402

from planner import clear_caches, native  # noqa: E402
from planner.hlo.text.compat import for_jaxlib_0_7  # noqa: E402
from planner.hlo.text.parser import parse_hlo  # noqa: E402
from planner.mesh import Mesh  # noqa: E402
from planner.plan import planner as planner_module  # noqa: E402
from planner.prepare import prepare  # noqa: E402
from planner.propagation import propagate  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))
PLAN_TARGET = 0.05
PROPAGATION_TARGET = 0.02
FLATNESS = 0.30


@dataclass(frozen=True)
class Step:
    name: str
    mesh: str
    tpu_topology: str

    def text(self) -> str:
        return for_jaxlib_0_7(self.path().read_text())

    def path(self) -> Path:
        if self.name.endswith(".hlo"):
            return SHARED / "corpus" / self.name
        from fidelity.cases import case_named
        from fidelity.references import ensure_references, reference_path

        case = case_named(self.name)
        failed = ensure_references([case])
        if failed:
            raise SystemExit(f"could not generate the reference {self.name}")
        return reference_path(case)


STEPS = (
    Step("torch_xla/llama_scan_L8_fsdp4_tp2.hlo", "fsdp=4,tp=2", "v6e:2x4"),
    Step("jax/jax_llama_scan_L8_fsdp4_tp2.hlo", "fsdp=4,tp=2", "v6e:2x4"),
    Step("jax_llama405b_remat_L126_fsdp64_tp4", "fsdp=64,tp=4", "v6e:16x16"),
)

# Runs in a child: one compile of the text on stdin, its seconds on stdout.
_COMPILE = """
import json, os, sys
request = json.load(sys.stdin)
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={request['num_devices']}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if request["tpu_topology"]:
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
from planner.plan.compilers.xla_compile import compile_spmd
_, seconds = compile_spmd(request["hlo"], request["num_devices"], True, request["tpu_topology"])
print(json.dumps({"seconds": seconds}))
"""


def _compile_in_child(
    text: str, num_devices: int, tpu_topology: str | None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One compile of `text` in a child process (`_COMPILE`); a failed compile ends the benchmark."""
    request = {"hlo": text, "num_devices": num_devices, "tpu_topology": tpu_topology}
    done = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps(request), capture_output=True,
                          text=True, cwd=REPO, timeout=1800, env=env)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"XLA's compile failed:\n{done.stderr[-2000:]}")
    return done


def xla_seconds(text: str, num_devices: int, tpu_topology: str | None) -> float:
    done = _compile_in_child(text, num_devices, tpu_topology)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


# XLA logs the start of every pass of a pipeline (hlo_pass_pipeline.cc at VLOG 1) with a microsecond
# timestamp: a pass lasts until the next pass or pipeline starts.
_PASS_LOG = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+): I .*hlo_pass_pipeline\.cc:\d+\]\s+"
    r"(?:HLO pass (\S+)|Running HLO pass pipeline)"
)
PROPAGATION_PASS = "sharding-propagation"


def xla_pass_seconds(text: str, num_devices: int, name: str = PROPAGATION_PASS) -> float | None:
    """How long XLA:CPU's own pass `name` (C++) ran in one compile of `text`, from XLA's pass log;
    None when the log does not show it. A compile of its own, so the headline compile is not logged."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="hlo_pass_pipeline=1")
    done = _compile_in_child(text, num_devices, None, env)
    starts = []
    for line in done.stderr.splitlines():
        m = _PASS_LOG.match(line)
        if m:
            when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
            starts.append((when, m.group(2)))
    durations = [end - start for (start, pass_name), (end, _) in itertools.pairwise(starts) if pass_name == name]
    return sum(durations) if durations else None


def has_libtpu() -> bool:
    from importlib.util import find_spec

    return find_spec("libtpu") is not None


def plan_seconds(text: str, mesh: Mesh | None) -> tuple[float, int]:
    """(seconds, simulations run) for one cold plan."""
    clear_caches()
    count = 0
    simulate = planner_module.simulate

    def counting(*args: object, **kwargs: object) -> planner_module.Simulation:
        nonlocal count
        count += 1
        return simulate(*args, **kwargs)  # type: ignore[arg-type]

    planner_module.simulate = counting  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        planner_module.make_plan(prepare(parse_hlo(text), mesh=mesh))
        return time.perf_counter() - start, count
    finally:
        planner_module.simulate = simulate  # type: ignore[assignment]


def propagation_seconds(text: str) -> float:
    clear_caches()
    start = time.perf_counter()
    propagate(prepare(parse_hlo(text)))
    return time.perf_counter() - start


def per_mb(repeat: int) -> None:
    """Plan seconds per MB of text over the corpus: flat means the plan grows with the module, no faster."""
    rows = []
    for path in sorted((SHARED / "corpus").glob("*/*.hlo")):
        text = path.read_text()
        runs = [plan_seconds(text, None) for _ in range(repeat)]
        rows.append((path.name, len(text) / 1e6, statistics.median(r[0] for r in runs), runs[0][1]))
    median = statistics.median(s / mb for _, mb, s, _ in rows)
    per_simulation = statistics.median(s / mb / n for _, mb, s, n in rows)
    # A plan re-simulates once per candidate placement: time per MB and simulation shows the scaling itself.
    print(f"\n{'corpus step':<48} {'MB':>6} {'plan s':>8} {'s/MB':>7} {'vs median':>9} {'sims':>5} {'s/MB/sim':>9} "
          f"{'vs median':>9}")  # fmt: skip
    for name, mb, seconds, sims in rows:
        print(f"{name:<48} {mb:>6.2f} {seconds:>8.3f} {seconds / mb:>7.3f} {seconds / mb / median - 1:>+9.0%} "
              f"{sims:>5} {seconds / mb / sims:>9.3f} {seconds / mb / sims / per_simulation - 1:>+9.0%}")  # fmt: skip
    spread = max(abs(s / mb / median - 1) for _, mb, s, _ in rows)
    verdict = "met" if spread <= FLATNESS else "missed"
    print(f"largest deviation from the median: {spread:+.0%} (target within +-{FLATNESS:.0%}: {verdict})")
    summary("plan seconds per MB, corpus", f"{len(rows)} steps", spread, FLATNESS, "frac", spread / FLATNESS,
            f"largest deviation from the median {median:.3f} s/MB; target <= {FLATNESS:.0%}: {verdict}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-tpu", action="store_true", help="skip the TPU compiler's ahead-of-time compile")
    ap.add_argument("--no-per-mb", action="store_true", help="skip the per-MB table over the corpus")
    # The 405B-shaped step's XLA:TPU compile alone takes about two minutes on two cores.
    ap.add_argument("--no-405b", action="store_true", help="only the two 8-device steps")
    args = ap.parse_args()
    tpu = has_libtpu() and not args.no_tpu
    print(f"planner core: {native.status()}")
    header = f"{'step':<42} {'plan s':>7} {'sims':>5} {'prop s':>7} {'XLA:CPU s':>10} {'plan/CPU':>9} {'prop/CPU':>9}"
    print(header + (f" {'XLA:TPU s':>10} {'plan/TPU':>9}" if tpu else ""))
    floors: list[tuple[str, float, int, float, float | None]] = []
    for step in STEPS:
        mesh = Mesh.parse(step.mesh)
        if args.no_405b and mesh.num_devices > 8:
            continue
        text = step.text()
        runs = [plan_seconds(text, mesh) for _ in range(args.repeat)]
        plan = statistics.median(r[0] for r in runs)
        prop = statistics.median(propagation_seconds(text) for _ in range(args.repeat))
        cpu = xla_seconds(text, mesh.num_devices, None)
        line = (f"{Path(step.name).stem:<42} {plan:>7.3f} {runs[0][1]:>5} {prop:>7.3f} {cpu:>10.3f} "
                f"{plan / cpu:>9.3f} {prop / cpu:>9.3f}")  # fmt: skip
        if tpu:
            tpu_seconds = xla_seconds(text, mesh.num_devices, step.tpu_topology)
            line += f" {tpu_seconds:>10.3f} {plan / tpu_seconds:>9.3f}"
        print(line, flush=True)
        case = Path(step.name).stem
        met = "met" if plan / cpu <= PLAN_TARGET else "missed"
        summary("full plan vs XLA:CPU compile", case, plan, cpu, "s", plan / cpu, f"target <= {PLAN_TARGET}: {met}")
        met = "met" if prop / cpu <= PROPAGATION_TARGET else "missed"
        summary("propagation vs XLA:CPU compile", case, prop, cpu, "s", prop / cpu,
                f"target <= {PROPAGATION_TARGET}: {met}")  # fmt: skip
        if tpu:
            met = "met" if plan / tpu_seconds <= PLAN_TARGET else "missed"
            summary("full plan vs XLA:TPU AOT compile", f"{case} ({step.tpu_topology})", plan, tpu_seconds, "s",
                    plan / tpu_seconds, f"target <= {PLAN_TARGET}: {met}")  # fmt: skip
        floors.append((case, prop, runs[0][1], cpu, xla_pass_seconds(text, mesh.num_devices)))
    # A plan simulates the step once per candidate placement: had each simulation cost what XLA's own
    # (C++) propagation pass costs, and everything else nothing, the plan would still take this much.
    print(f"\nXLA:CPU's own {PROPAGATION_PASS} pass, timed from its pass log, against the plan's simulations:")
    print(f"{'step':<42} {'XLA pass s':>10} {'prop s':>7} {'prop/pass':>9} {'sims':>5} {'sims x pass/CPU':>15}")
    for case, prop, sims, cpu, xla_pass in floors:
        if xla_pass is None:
            print(f"{case:<42} {'n/a':>10} (XLA's log does not show the pass)")
            continue
        floor = sims * xla_pass / cpu
        print(f"{case:<42} {xla_pass:>10.4f} {prop:>7.3f} {prop / xla_pass:>9.2f} {sims:>5} {floor:>15.3f}")
        summary("plan at XLA's own propagation speed", case, sims * xla_pass, cpu, "s", floor,
                f"{sims} simulations x XLA's {PROPAGATION_PASS} pass ({xla_pass * 1000:.1f} ms), nothing else; "
                f"target <= {PLAN_TARGET}")  # fmt: skip
    if not args.no_per_mb:
        per_mb(args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
