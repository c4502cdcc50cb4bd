"""Reading what XLA writes with `--xla_dump_to`: the step's module, its While shapes, its buffer assignment.

The runners set the flags (`xla_flags`) before the framework starts; XLA then writes, per compiled
module, `module_NNNN.NAME.before_optimizations.txt`, the pass boundaries picked by
`--xla_dump_hlo_pass_re` and `--xla_dump_hlo_pipeline_re` (`module_NNNN.NAME.SEQ.PIPELINE.after_PASS.before_NEXT.txt`)
and `...after_optimizations.txt` with its `-buffer-assignment.txt`. XLA:TPU's files carry a tag after
the module name (`module_0001.jit_train_step.cl_789893895.1163.xla-partitioner.after_...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# The boundaries the records read, inside the partitioning pipelines only: XLA:CPU's `spmd-partitioner`
# and XLA:TPU's `xla-partitioner` (anchored: `xla-partitioner-optimizations` is another pipeline).
# Propagation is `sharding-propagation` under GSPMD (XLA:TPU runs it twice, around convolution
# folding) and `shardy-xla` under Shardy; `spmd-partitioning` also matches `tpu-spmd-partitioning`.
# A pass is dumped when its name or its neighbour's matches, so the module entering propagation
# (`after_dce.before_sharding-propagation`) is written too: 6 files for XLA:TPU, 3 for XLA:CPU,
# where `.+` everywhere writes ~1,600 (270 MB for a small step).
DUMP_PASS_RE = "sharding-propagation|shardy-xla|spmd-partitioning"
DUMP_PIPELINE_RE = "^(spmd-partitioner|xla-partitioner)$"
PROPAGATION_PASSES = ("sharding-propagation", "shardy-xla")
PARTITIONING_PASSES = ("spmd-partitioning", "tpu-spmd-partitioning")

_MODULE_HEADER = re.compile(r"^HloModule\s+\S+?,?\s")
# `[ENTRY] %name (params) -> shape {` in the long form dumps print; `name {` in the short form.
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
_WHILE = re.compile(r"^\s*(?:ROOT\s+)?%?(\S+)\s=\s(.*?)\swhile\(")
_CALLEE = re.compile(r"\b(condition|body)=%?([\w.\-]+)")
_INSTRUCTION_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s=\s")
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(?:, (.*?))?:?$")
# `SEQ.PIPELINE.after_PASS.before_NEXT.txt` after the module's prefix.
_BOUNDARY = re.compile(r"^(\d+)\.(.+?)\.after_(.+?)\.before_(.+?)\.txt$")


def xla_flags(
    dump_dir: Path,
    num_host_devices: int | None = None,
    dump_all: bool = False,
    disabled_passes: tuple[str, ...] = (),
) -> str:
    """XLA_FLAGS for one runner process: read once, by every compiler in it (XLA:CPU and XLA:TPU alike).

    `dump_all` dumps every boundary of every pipeline (`.+`: the literal `.*` keeps only the passes
    that changed the module); `disabled_passes` turns passes or whole pipelines off by name.
    """
    flags = [f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_as_text"]
    if dump_all:
        flags.append("--xla_dump_hlo_pass_re=.+")
    else:
        flags += [f"--xla_dump_hlo_pass_re={DUMP_PASS_RE}", f"--xla_dump_hlo_pipeline_re={DUMP_PIPELINE_RE}"]
    if disabled_passes:
        flags.append("--xla_disable_hlo_passes=" + ",".join(disabled_passes))
    if num_host_devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={num_host_devices}")
    return " ".join(flags)


@dataclass(frozen=True)
class Boundary:
    """One dumped pass boundary: the module after `after` ran and before `before` runs."""

    path: Path
    sequence: int
    pipeline: str
    after: str
    before: str


@dataclass(frozen=True)
class ModuleDump:
    """One compiled module's files in a dump directory, found by their common `module_NNNN.NAME` prefix."""

    dump_dir: Path
    prefix: str

    def _one(self, pattern: str) -> Path:
        # Passes that run in several pipelines dump once per run: the last sequence number is the final state.
        found = sorted(self.dump_dir.glob(f"{self.prefix}.{pattern}"))
        if not found:
            raise FileNotFoundError(f"no {self.prefix}.{pattern} in {self.dump_dir}")
        return found[-1]

    def boundaries(self) -> list[Boundary]:
        """Every dumped pass boundary of this module, in the order the passes ran."""
        found = []
        for path in self.dump_dir.glob(f"{self.prefix}.*.txt"):
            if m := _BOUNDARY.match(path.name[len(self.prefix) + 1 :]):
                found.append(Boundary(path, int(m.group(1)), m.group(2), m.group(3), m.group(4)))
        return sorted(found, key=lambda b: b.sequence)

    def _boundary(self, what: str, passes: tuple[str, ...], last: bool, side: str) -> Path:
        matches = [b for b in self.boundaries() if getattr(b, side) in passes]
        if not matches:
            raise FileNotFoundError(f"no dump {side} {'/'.join(passes)} for {self.prefix} in {self.dump_dir}: {what}")
        return matches[-1 if last else 0].path

    @property
    def before_propagation(self) -> Path:
        """The module as it enters the first propagation pass."""
        return self._boundary("the module entering propagation", PROPAGATION_PASSES, last=False, side="before")

    @property
    def after_propagation(self) -> Path:
        """The module after the last propagation pass: every instruction's sharding as the partitioner sees it."""
        return self._boundary("the propagated module", PROPAGATION_PASSES, last=True, side="after")

    @property
    def before_optimizations(self) -> Path:
        return self._one("before_optimizations.txt")

    @property
    def after_spmd_partitioning(self) -> Path:
        """The partitioned, per-device program (`spmd-partitioning`, or XLA:TPU's `tpu-spmd-partitioning`)."""
        return self._boundary("the partitioned module", PARTITIONING_PASSES, last=True, side="after")

    @property
    def after_optimizations(self) -> Path:
        return self._one("*after_optimizations.txt")

    @property
    def buffer_assignment(self) -> Path:
        return self._one("*after_optimizations-buffer-assignment.txt")

    def file_names(self) -> list[str]:
        return [
            p.name
            for p in (
                self.before_optimizations,
                self.after_spmd_partitioning,
                self.after_optimizations,
                self.buffer_assignment,
            )
        ]


def largest_module(dump_dir: Path, exclude: tuple[str, ...] = ()) -> ModuleDump:
    """The module with the biggest unoptimized text: a training step dwarfs the small graphs run around it.

    `exclude` names prefixes already taken: a runner compiles the step for XLA:CPU, then for XLA:TPU
    into the same directory.
    """
    candidates = [
        p
        for p in dump_dir.glob("module_*.before_optimizations.txt")
        if p.name.removesuffix(".before_optimizations.txt") not in exclude
    ]
    if not candidates:
        raise FileNotFoundError(f"no module_*.before_optimizations.txt in {dump_dir} besides {list(exclude)}")
    best = max(candidates, key=lambda p: p.stat().st_size)
    return ModuleDump(dump_dir, best.name.removesuffix(".before_optimizations.txt"))


def while_shapes(hlo_text: str) -> list[dict[str, str]]:
    """Every While in a module: its tuple shape and the computations around it, in file order."""
    found: list[dict[str, str]] = []
    computation = ""
    for line in hlo_text.splitlines():
        if not line[:1].isspace() and (m := _COMPUTATION.match(line)) and not line.startswith("HloModule"):
            computation = m.group(1)
            continue
        if m := _WHILE.match(line):
            callees = dict(_CALLEE.findall(line))
            found.append(
                {
                    "name": m.group(1),
                    "shape": m.group(2),
                    "computation": computation,
                    "body": callees.get("body", ""),
                    "condition": callees.get("condition", ""),
                }
            )
    return found


def allocation_bytes_by_kind(buffer_assignment_text: str) -> dict[str, int]:
    """Bytes per allocation kind, keyed by the first attribute XLA prints after the size.

    `allocation 7: size 16, output shape is |(f32[], ...)|, maybe-live-out:` is an "output" (the
    output tuple's index table); `allocation 1: size 131072, parameter 0, shape |f32[4,64,128]| ...`
    a "parameter"; `allocation 33: size 275776, preallocated-temp:` the temporaries. The sum over all
    kinds is the per-device total the torch_xla corpus records as `xla_per_device_total_bytes`.
    """
    by_kind: dict[str, int] = {}
    for line in buffer_assignment_text.splitlines():
        m = _ALLOCATION.match(line)
        if not m:
            continue
        first = (m.group(2) or "unknown").split(",")[0].strip()
        kind = first.split()[0] if first.startswith(("parameter", "output")) else first
        by_kind[kind] = by_kind.get(kind, 0) + int(m.group(1))
    return by_kind


def header_attribute_names(hlo_text: str) -> list[str]:
    """Top-level attribute names of the `HloModule` line, in order (`entry_computation_layout`, ...)."""
    line = hlo_text.split("\n", 1)[0]
    if not _MODULE_HEADER.match(line + " "):
        return []
    # Split at commas outside brackets: layouts and frontend attributes hold commas of their own.
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(line):
        depth += (ch in "{([") - (ch in "})]")
        if ch == "," and depth == 0:
            parts.append(line[start:i])
            start = i + 1
    parts.append(line[start:])
    return [p.split("=", 1)[0].strip() for p in parts[1:] if "=" in p]


def instruction_names(hlo_text: str) -> list[str]:
    return [m.group(1) for line in hlo_text.splitlines() if (m := _INSTRUCTION_NAME.match(line))]
