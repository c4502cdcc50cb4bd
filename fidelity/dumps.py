"""Reading what XLA writes with `--xla_dump_to`: the step's module, its While shapes, its buffer assignment.

The runners set the flags (`xla_flags`) before the framework starts; XLA then writes, per compiled
module, `module_NNNN.NAME.before_optimizations.txt`, the passes picked by `--xla_dump_hlo_pass_re`
(`module_NNNN.NAME.SEQ.PIPELINE.after_PASS.before_NEXT.txt`) and, on CPU,
`module_NNNN.NAME.cpu_after_optimizations.txt` with its `-buffer-assignment.txt`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Only the partitioner's own pass: its output is the per-device program, the shapes we record.
DUMP_PASS_RE = "spmd-partitioning"

_MODULE_HEADER = re.compile(r"^HloModule\s+\S+?,?\s")
# `[ENTRY] %name (params) -> shape {` in the long form dumps print; `name {` in the short form.
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
_WHILE = re.compile(r"^\s*(?:ROOT\s+)?%?(\S+)\s=\s(.*?)\swhile\(")
_CALLEE = re.compile(r"\b(condition|body)=%?([\w.\-]+)")
_INSTRUCTION_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s=\s")
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(?:, (.*?))?:?$")


def xla_flags(dump_dir: Path, num_host_devices: int | None = None) -> str:
    flags = [f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_as_text", f"--xla_dump_hlo_pass_re={DUMP_PASS_RE}"]
    if num_host_devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={num_host_devices}")
    return " ".join(flags)


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

    @property
    def before_optimizations(self) -> Path:
        return self._one("before_optimizations.txt")

    @property
    def after_spmd_partitioning(self) -> Path:
        return self._one("*after_spmd-partitioning*.txt")

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


def largest_module(dump_dir: Path) -> ModuleDump:
    """The module with the biggest unoptimized text: a training step dwarfs the small graphs run around it."""
    candidates = list(dump_dir.glob("module_*.before_optimizations.txt"))
    if not candidates:
        raise FileNotFoundError(f"no module_*.before_optimizations.txt in {dump_dir}")
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
