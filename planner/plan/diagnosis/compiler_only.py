"""Findings only the target's compiler has: on a TPU chip, what XLA:CPU decides instead, and why.

XLA:TPU and XLA:CPU run the same propagation on different modules (XLA:TPU simplifies first), so a
gradient one leaves under-sharded the other may shard like its parameter. For each finding of a
TPU plan that the same step prepared for XLA:CPU does not have, the cause is found the way one
finds it on the real compiler: the TPU pipeline is run again with one group of its passes
disabled (`prepare(disabled=...)`, as `--xla_disable_hlo_passes` does), and the groups without
which the finding disappears are named with what they do.

A finding is the same one on both compilers when its loop element reaches the same outputs of
the step (its gradient output), else when it has the same kind and shape (counted: two of a shape
on TPU against one on CPU leaves one TPU-only).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from planner.hlo.ir.module import HloModule
from planner.plan.diagnosis.findings import GRADIENT_KINDS, GRADIENT_OUTPUT, Finding, buffer_findings, output_findings
from planner.plan.diagnosis.output_pairs import output_gradients
from planner.plan.diagnosis.scan_pairs import accumulated_gradients, output_positions, stacked_gradients
from planner.plan.manifest import Manifest
from planner.prepare import PreparedModule, prepare
from planner.propagation import propagate


@dataclass(frozen=True)
class PassGroup:
    """Passes that act together, named as XLA's dumps name them, and what they do to the module."""

    passes: frozenset[str]
    does: str

    @property
    def label(self) -> str:
        return ", ".join(sorted(self.passes))


LOOP_PASSES = frozenset(
    {"while-loop-constant-sinking", "simplify-while-loops", "while-loop-invariant-code-motion", "hlo-module-dce"}
)
TPU_PASS_GROUPS: tuple[PassGroup, ...] = (
    PassGroup(
        LOOP_PASSES,
        "they take constants and repeated or dead elements out of the loop's carried tuple, so nothing "
        "ties the loop's carry to the sharding those elements had",
    ),
    PassGroup(frozenset({"cse"}), "it merges equal values, so two loop elements carry one value"),
    PassGroup(
        frozenset({"sparse-gradient-rewrite"}),
        "it rewrites the cross-entropy gradient's scatter as a one-hot select, which follows the labels' batch split",
    ),
    PassGroup(frozenset({"hlo-constant-splitter"}), "it gives every reader of a constant expression its own copy"),
    PassGroup(
        frozenset({"algsimp"}),
        "it writes broadcasts that only add size-1 dims as reshapes, which propagation crosses three levels earlier, "
        "and reads a slice of a concatenate from the concatenated operand, so the loop carries that operand",
    ),
    PassGroup(
        frozenset({"list-order"}),
        "XLA's list has inlined annotations nothing reads after the root, so a shard_as group is decided by the "
        "values the body computes before the annotated weights",
    ),
)


def _identity(module: HloModule, prepared: PreparedModule, finding: Finding) -> Hashable:
    if finding.kind == GRADIENT_OUTPUT:
        return ("outputs", (finding.index,))
    loop = prepared.loop(finding.loop)
    positions = output_positions(module, loop, finding.index)
    return ("outputs", tuple(positions)) if positions else (finding.kind, finding.shape)


def _findings(
    prepared: PreparedModule, threshold: float, min_bytes: int, manifest: Manifest | None
) -> Counter[Hashable]:
    result = propagate(prepared)
    module = prepared.module
    gradients = stacked_gradients(module, result, manifest, prepared.mesh)
    accumulated = accumulated_gradients(module, result, gradients)
    found = buffer_findings(module, result, _num_devices(prepared), threshold, min_bytes, gradients=gradients,
                            accumulated=accumulated)  # fmt: skip
    found += output_findings(module, output_gradients(prepared, result, manifest), threshold, min_bytes)
    return Counter(_identity(module, prepared, f) for f in found)


def _num_devices(prepared: PreparedModule) -> int:
    if prepared.mesh is not None:
        return prepared.mesh.num_devices
    return int(prepared.source.attr("num_partitions") or 1)


def compiler_only(
    prepared: PreparedModule,
    findings: list[Finding],
    threshold: float,
    min_bytes: int,
    manifest: Manifest | None,
) -> dict[str, str]:
    """For a TPU target: each finding XLA:CPU does not have (by `Finding.key`), and why it is XLA:TPU's."""
    if prepared.compiler != "tpu" or not findings:
        return {}
    on_cpu = prepare(prepared.source, "cpu", prepared.mesh, prepared.options)
    cpu = _findings(on_cpu, threshold, min_bytes, manifest)
    only: list[Finding] = []
    for f in findings:
        key = _identity(prepared.module, prepared, f)
        if cpu[key] > 0:
            cpu[key] -= 1
        else:
            only.append(f)
    if not only:
        return {}
    causes = _causes(prepared, only, threshold, min_bytes, manifest)
    return {f.key: _why(f, causes.get(f.key, [])) for f in only}


def _causes(
    prepared: PreparedModule, only: list[Finding], threshold: float, min_bytes: int, manifest: Manifest | None
) -> dict[str, list[PassGroup]]:
    """The pass groups without which the simulated XLA:TPU does not have each finding."""
    wanted: dict[str, Hashable] = {f.key: _identity(prepared.module, prepared, f) for f in only}
    found: dict[str, list[PassGroup]] = {}
    for group in TPU_PASS_GROUPS:
        without = prepare(prepared.source, prepared.target, prepared.mesh, prepared.options,
                          disabled=prepared.disabled | group.passes)  # fmt: skip
        if without.module == prepared.module:
            continue  # the group changed nothing on this step
        still = _findings(without, threshold, min_bytes, manifest)
        for key, identity in wanted.items():
            if still[identity] == 0:
                found.setdefault(key, []).append(group)
    return found


def _why(finding: Finding, groups: list[PassGroup]) -> str:
    gradient = finding.kind in GRADIENT_KINDS
    what = "shards this gradient like its parameter" if gradient else "splits this buffer"
    head = f"XLA:CPU {what}; XLA:TPU does not"
    if not groups:
        return f"{head}: its pre-partitioning passes together make the difference (disabling no one group of them does)"
    reasons = " and ".join(f"its {g.label} ({g.does})" for g in groups)
    each = "each" if len(groups) > 1 else "it"
    return f"{head}, because of {reasons}; with {each} disabled the simulated XLA:TPU does the same as XLA:CPU"
