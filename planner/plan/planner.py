"""Putting it together: findings, root causes, placements, and their re-simulated gain.

Every candidate placement is re-simulated on its own (apply it to the IR,
propagate again, size memory again). Candidates are then taken greedily,
largest saving first, each kept only if the module with it and the ones kept
before predicts less HBM per chip; the rest stay in the plan, not
recommended, with the numbers saying why. A change set that saves less than
`min_bytes` in all is not recommended either. A placement that leaves
every sharding propagation decides as it was is never recommended, whatever
the memory model says: XLA partitions that step exactly as it would without
it (its Sharding custom-call is removed once propagation is done), so there
is nothing for it to save. Pinning every scanned parameter
(what `mark_sharding_with_gradients` on every weight does) is re-simulated as
an alternative: pins that do nothing alone can pay off together, so when it
predicts less than doing nothing and no more than the greedy pick (within
`min_bytes`, the prediction's noise), it is the recommendation instead: it
pins each gradient itself rather than leaving some to propagation. The
patched module carries the recommended placements only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from planner.errors import PlanningError, Unverifiable
from planner.gc_pause import collection_paused
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.frontend import TORCH_XLA, front_end_of
from planner.hlo.text.shardy_import import SHARDY, partitioner_of
from planner.memory import MemoryEstimate, MemoryEstimation, MemoryReport, memory_report, memory_timeline
from planner.memory.buffers import leaf_shardings, per_device_bytes
from planner.memory.report import BufferLine
from planner.mesh import Mesh
from planner.plan.compilers.confirmation import confirmation, measured_by_target
from planner.plan.compilers.verify import Predicted
from planner.plan.compilers.verify import verify as verify_with_xla
from planner.plan.diagnosis.compiler_only import compiler_only
from planner.plan.diagnosis.findings import GRADIENT_OUTPUT, Finding, buffer_findings, output_findings
from planner.plan.diagnosis.groups import shard_group_conflicts
from planner.plan.diagnosis.output_pairs import output_gradients
from planner.plan.diagnosis.plan_warnings import plan_warnings
from planner.plan.diagnosis.root_cause import root_cause
from planner.plan.diagnosis.scan_pairs import accumulated_gradients, stacked_gradients
from planner.plan.diagnosis.split_picture import tensor_split
from planner.plan.fixes.front_names import Unwritable, front_placement, written_on_front
from planner.plan.fixes.names import NameTable, name_table
from planner.plan.fixes.next_steps import Step, beyond_sharding
from planner.plan.fixes.placements import (
    PIN_OUTPUT,
    SPLIT_SHARD_GROUP,
    Placement,
    apply_placements,
    max_group_id,
    pin_output,
    pin_parameter,
    split_group,
)
from planner.plan.fixes.user_form import user_form
from planner.plan.manifest import Manifest
from planner.plan.model import (
    AlternativeInfo,
    AnnotationInfo,
    BufferInfo,
    ConflictInfo,
    FindingInfo,
    GroupMemberInfo,
    HbmInfo,
    LoopInfo,
    PlacementInfo,
    Plan,
    RootCauseInfo,
    SplitPictureInfo,
    TensorSplitInfo,
    TimelineSeries,
    TorchPinInfo,
    UserPlacementInfo,
    Verification,
    VerifyNotRun,
)
from planner.plan.verdict import Band, band_for, verdict, verify_command
from planner.prepare import PreparedModule, annotate, prepare, reprepare
from planner.progress import note
from planner.propagation import PropagationResult, ShardingPropagation
from planner.propagation.shardy.release import ShardyRelease
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.partition_spec import AxisSpec
from planner.targets import tpu_topology
from planner.units import format_bytes

PIN_EVERY_PARAMETER = "pin every scanned parameter and its gradient"


@dataclass(frozen=True)
class Simulation:
    """A prepared module with its propagated shardings and predicted memory."""

    prepared: PreparedModule
    result: PropagationResult
    memory: MemoryReport
    estimate: MemoryEstimate  # what `memory` reports, kept for the timeline

    @property
    def module(self) -> HloModule:
        """The module propagation saw."""
        return self.prepared.module

    @property
    def total(self) -> int:
        return self.memory.total_bytes


_INT64_MAX = (1 << 63) - 1


def simulate(prepared: PreparedModule, capacity_bytes: int | None) -> Simulation:
    """Propagate the prepared module and size it for its target."""
    result = ShardingPropagation().apply(prepared)
    estimate = MemoryEstimation().apply(prepared, result)
    memory = memory_report(prepared, capacity_bytes, result=result, estimate=estimate)
    return Simulation(prepared, result, memory, estimate)


@dataclass(frozen=True)
class Planning:
    """The planning pass as a value (see `planner.passes`): `make_plan`'s options are its fields."""

    capacity_bytes: int | None = None
    threshold: float = 1.5
    min_bytes: int = 1 << 20
    manifest: Manifest | None = None
    verify: bool = False

    def apply(self, prepared: PreparedModule) -> tuple[Plan, HloModule]:
        return make_plan(prepared, self.capacity_bytes, self.threshold, self.min_bytes, self.manifest, self.verify)


def make_plan(
    prepared: PreparedModule,
    capacity_bytes: int | None = None,
    threshold: float = 1.5,
    min_bytes: int = 1 << 20,
    manifest: Manifest | None = None,
    verify: bool = False,
) -> tuple[Plan, HloModule]:
    """The plan for the prepared module's target, and the module patched with its recommended placements.

    A chip preset as the target predicts that chip's compiler (XLA:TPU for a TPU chip); `cpu`
    predicts XLA:CPU. With `verify`, real XLA compiles the original and the patched module (see
    `verify`): XLA:CPU, and XLA:TPU too when the target is a TPU chip and libtpu is installed.
    """
    with collection_paused():
        return _make_plan(prepared, capacity_bytes, threshold, min_bytes, manifest, verify)


def _make_plan(
    prepared: PreparedModule,
    capacity_bytes: int | None,
    threshold: float,
    min_bytes: int,
    manifest: Manifest | None,
    verify: bool,
) -> tuple[Plan, HloModule]:
    module, mesh = prepared.source, prepared.mesh
    if manifest is not None:
        _check_manifest(module, manifest)
    chip_name = None if prepared.target.name == "cpu" else prepared.target.name
    note("planning: propagating shardings and sizing memory")
    before = simulate(prepared, capacity_bytes)
    if before.total > _INT64_MAX:
        # XLA's parser reads such shapes, but no buffer assignment sizes them: its offsets are int64.
        raise PlanningError(f"the step needs {before.total:,} bytes per chip, more than 2^63 - 1: no XLA "
                            "compile can assign its buffers (check the shapes' dims)")  # fmt: skip
    seen = prepared.module
    num_devices = before.memory.num_devices
    axes = mesh if mesh is not None else Mesh((num_devices,), ("devices",))
    gradients = stacked_gradients(seen, before.result, manifest, mesh)
    accumulated = accumulated_gradients(seen, before.result, gradients)
    findings = buffer_findings(seen, before.result, num_devices, threshold, min_bytes, gradients=gradients,
                               accumulated=accumulated)  # fmt: skip
    returned = output_gradients(prepared, before.result, manifest)
    findings += output_findings(seen, returned, threshold, min_bytes)
    only_here = compiler_only(prepared, findings, threshold, min_bytes, manifest)
    names = name_table(seen, manifest, gradients=gradients)
    conflicts = shard_group_conflicts(prepared, before.result)

    # Found on the module the compiler's passes leave, written in the names of the module as written; a pin
    # of an instruction only a pass makes has nothing to annotate there, and the plan says so (`front_names`).
    on_front = {g.key: front_placement(p, prepared) for g in gradients
                if (p := pin_parameter(seen, g, accumulated)) is not None}  # fmt: skip
    pins = {key: p for key, p in on_front.items() if isinstance(p, Placement)}
    unwritable_pins = [u for u in on_front.values() if isinstance(u, Unwritable)]
    # Candidates: gradients (or their accumulators) not already sharded like their parameter, returned
    # gradients found under-sharded, and conflicting groups.
    short = {g.key for g in gradients if g.sharding != g.ideal}
    short |= {a.gradient.key for a in accumulated if a.sharding != a.ideal}
    candidates = [pins[g.key] for g in gradients if g.key in pins and g.key in short]
    unwritten = [u for key, u in on_front.items() if isinstance(u, Unwritable) and key in short]
    flagged = {f.index for f in findings if f.kind == GRADIENT_OUTPUT}
    others = [pin_output(seen, g, *_manifest_pin(manifest, g.position)) for g in returned if g.position in flagged]
    next_id = max_group_id(seen) + 1
    for conflict in conflicts:
        split = split_group(seen, conflict.group, next_id)
        if split is not None:
            others.append(split)
            next_id += len(split.annotations)
    written_others, unwritable_others = written_on_front(others, prepared)
    candidates += written_others
    unwritten += unwritable_others

    simulations: dict[frozenset[str], Simulation] = {frozenset(): before}

    def with_placements(chosen: list[Placement]) -> Simulation:
        key = frozenset(p.id for p in chosen)
        if key not in simulations:
            patched = annotate(prepared, lambda module: apply_placements(module, chosen, prepared.aliases))
            simulations[key] = simulate(patched, capacity_bytes)
        return simulations[key]

    alone = {p.id: with_placements([p]).total for p in candidates}
    refused = {p.id: IDLE_WHY for p in candidates if not changes_shardings(before.result, with_placements([p]).result)}
    if prepared.target.lends_unwritten_outputs:
        refused |= {p.id: UNCLAIMED_OUTPUT_WHY.format(prepared.target.name) for p in candidates
                    if p.kind == PIN_OUTPUT and p.id not in refused}  # fmt: skip
    # torch_xla's handles limit what is recommended, and the words of an empty change set say so.
    front_end = front_end_of(module)
    limited_to = TORCH_XLA if front_end == TORCH_XLA else None
    if limited_to is not None:
        for p in candidates:
            what = _no_torch_xla_handle(p)
            if what is not None and p.id not in refused:
                refused[p.id] = NO_TORCH_XLA_HANDLE_WHY.format(what, _mb(before.total), _mb(alone[p.id]))
    left_out = manifest.left_out if manifest is not None else None
    if left_out is not None:
        for p in candidates:
            refused.setdefault(p.id, PARTIAL_STEP_WHY.format(left_out, _mb(before.total), _mb(alone[p.id])))
    chosen, after, verdicts = _greedy(candidates, alone, refused, before, with_placements)

    alternatives = []
    pin_every = False
    every = list(pins.values())
    if every and {p.id for p in every} != {p.id for p in chosen}:
        everything = with_placements(every)
        idle = not changes_shardings(before.result, everything.result)
        # Within the prediction's noise (`min_bytes`, what a finding must waste) of the greedy pick it is the
        # better change: it pins each gradient itself, where the greedy pick leaves some to follow their
        # neighbours through propagation, which the compiler need not repeat (Shardy does not). Example: the
        # JAX example step's greedy pick of five pins predicts 4 KB less than pinning all nine, and XLA:CPU
        # then leaves a pinned norm gradient split over tp.
        better = (everything.total < before.total and everything.total <= after.total + min_bytes and not idle
                  and left_out is None)  # fmt: skip
        alternatives.append(
            AlternativeInfo(
                name=PIN_EVERY_PARAMETER,
                placements=[p.id for p in every],
                predicted_total=everything.total,
                recommended=better,
                why=_every_pin_why(idle, left_out, before.total, after.total, everything.total, min_bytes)
                + _without_unwritable(unwritable_pins),
            )
        )
        if better:
            # Pins that do nothing alone can pay off together (saved activations follow
            # the weights they meet): take the whole set instead of the greedy pick.
            why = f"part of pinning every scanned parameter: together {_mb(before.total)} -> {_mb(everything.total)}"
            for p in every:
                verdicts[p.id] = (True, why + (f" (alone: {_mb(alone[p.id])})" if p.id in alone else ""))
            for p in candidates:
                if p not in every:
                    verdicts[p.id] = (
                        False,
                        f"not needed once every scanned parameter is pinned (alone: "
                        f"{_mb(before.total)} -> {_mb(alone[p.id])})",
                    )
            candidates = every + [p for p in candidates if p not in every]
            chosen, after = every, everything
            pin_every = True
    if chosen and before.total - after.total < min_bytes:
        # A change set worth making saves at least what a finding must waste: below that the prediction is noise.
        small = f"the change set saves less than {_mb(min_bytes)} per chip ({_mb(before.total)} -> {_mb(after.total)})"
        verdicts = {
            pid: (False, small) if recommended else (False, why) for pid, (recommended, why) in verdicts.items()
        }
        for alternative in alternatives:
            if alternative.recommended:
                alternative.recommended, alternative.why = False, small
        chosen, after, pin_every = [], before, False

    def assemble(
        after: Simulation, verdicts: dict[str, tuple[bool, str]], pin_every: bool, withdrawn: str | None = None
    ) -> Plan:
        plan = Plan(
            module=module.name,
            num_partitions=module.attr("num_partitions"),
            mesh=mesh.to_text() if mesh is not None else None,
            partitioner=_partitioner_note(module),
            shardy_release=ShardyRelease.installed().label if partitioner_of(module) == SHARDY else None,
            loops=_loops(before, after),
            hbm=HbmInfo(
                backend=prepared.target.name,
                capacity_bytes=capacity_bytes,
                per_chip_before={str(k): v for k, v in before.memory.per_chip_bytes.items()},
                per_chip_after={str(k): v for k, v in after.memory.per_chip_bytes.items()},
                total_before=before.total,
                total_after=after.total,
                breakdown_before=before.memory.breakdown,
                breakdown_after=after.memory.breakdown,
                top_buffers_before=[_buffer(b, names) for b in before.memory.top_buffers],
                top_buffers_after=[_buffer(b, names) for b in after.memory.top_buffers],
                host_before=before.memory.host_bytes,
                host_after=after.memory.host_bytes,
            ),
            findings=[_finding(before, after, f, axes, names, only_here.get(f.key)) for f in findings],
            conflicts=[
                ConflictInfo(group=c.group, members=[GroupMemberInfo(**asdict(m)) for m in c.members])
                for c in conflicts
            ],
            placements=[
                _placement(p, alone.get(p.id), *verdicts[p.id], names, front_end, mesh, prepared.resolve)
                for p in candidates
            ]
            + [_unwritable(u, names, front_end, mesh, prepared.resolve) for u in unwritten],
            alternatives=alternatives,
            timeline_before=_timeline(before),
            timeline_after=_timeline(after),
        )
        # The request's warnings, then what the planner cannot help this step with (`plan_warnings`).
        plan.warnings = list(prepared.warnings) + plan_warnings(prepared)
        if left_out is not None:
            plan.warnings.append(PARTIAL_STEP_WARNING.format(left_out))
        plan.withdrawn = withdrawn
        plan.verdict = verdict(
            plan.hbm,
            plan.placements,
            PIN_EVERY_PARAMETER if pin_every else None,
            chip_name,
            withdrawn,
            band_for(prepared, before.memory.peak_chip_bytes),
            verify_command=verify_command(mesh, chip_name, capacity_bytes),
            framework=limited_to,
            left_out=left_out,
        )
        if capacity_bytes is not None and after.memory.peak_chip_bytes > capacity_bytes:
            # Sharding is not enough: what holds the peak, and the changes beyond it, each predicted.
            step = Step(after.prepared, after.result, capacity_bytes)
            plan.peak_holders, plan.next_steps, plan.next_steps_unavailable = beyond_sharding(step, gradients)
        return plan

    plan = assemble(after, verdicts, pin_every)
    patched = after.prepared.written_front
    if not verify:
        return plan, patched
    topology = tpu_topology(chip_name, num_devices) if chip_name is not None else None
    note("verifying the plan with real compiles")
    try:
        checked = verify_with_xla(
            module,
            prepared.written_front,
            patched,
            gradients,
            num_devices,
            _predicted(before, after, capacity_bytes),
            topology,
        )
    except Unverifiable as e:
        plan.verify_not_run = VerifyNotRun.of(e)
        return plan, patched
    checked.confirmed, withdrawn = confirmation(checked, prepared.compiler)
    if withdrawn is not None and chosen:
        # The compiler the plan is for does not back the claim: the plan recommends nothing, and says why.
        verdicts = {pid: (False, withdrawn) if recommended else (False, why)
                    for pid, (recommended, why) in verdicts.items()}  # fmt: skip
        for alternative in alternatives:
            if alternative.recommended:
                alternative.recommended, alternative.why = False, withdrawn
        plan, patched = assemble(before, verdicts, False, withdrawn), prepared.written_front
    plan.verification = checked
    outside = _outside_band(checked, band_for(prepared, before.memory.peak_chip_bytes))
    if outside is not None:
        plan.warnings.append(outside)
    measured = measured_by_target(checked, prepared.compiler, withdrawn is not None)
    if measured is not None and plan.verdict is not None:
        # The compiler the plan is for measured the step: its bytes decide the verdict, no band needed.
        pin_every_name = PIN_EVERY_PARAMETER if pin_every and withdrawn is None else None
        plan.verdict = verdict(plan.hbm, plan.placements, pin_every_name, chip_name, withdrawn, measured=measured,
                               framework=limited_to, left_out=left_out)  # fmt: skip
    return plan, patched


def _outside_band(checked: Verification, band: Band | None) -> str | None:
    """What to say when the compiler verify ran measured the step as given outside the band of the prediction
    (our bytes for that compiler against its own): the band a verdict is drawn from did not hold here."""
    error = checked.prediction_error()
    if band is None or error is None or band.under <= error <= band.over:
        return None
    return (f"{checked.xla} measured the step at {_mb(checked.before_total_bytes)} per device; the prediction, "
            f"{_mb(checked.predicted_before_bytes or 0)}, is {error:+.1%} from it, outside its band "
            f"({band.under:+.1%} to {band.over:+.1%}, {band.kind}): trust the measured bytes over the band's "
            "verdict")  # fmt: skip


def _predicted(before: Simulation, after: Simulation, capacity_bytes: int | None) -> Predicted:
    """Our numbers for the compilers verify asks: XLA:CPU always, and the chip's XLA:TPU when it is one."""
    if before.prepared.compiler == "cpu":
        return Predicted(before.total, after.total)
    # XLA:CPU's own pipeline, on the same placements: what --verify's XLA:CPU compile partitions.
    on_cpu = prepare(before.prepared.source, "cpu", before.prepared.mesh, before.prepared.options)

    def cpu_total(sim: Simulation) -> int:
        changed = reprepare(on_cpu, sim.prepared.front, shardy_front=sim.prepared.shardy_front)
        return memory_report(changed, capacity_bytes).total_bytes

    return Predicted(cpu_total(before), cpu_total(after), before.total, after.total)


def changes_shardings(before: PropagationResult, after: PropagationResult) -> bool:
    """Whether any instruction of the module before the placements is sharded differently after them."""
    return any(after.sharding(name) != sharding for name, sharding in before.shardings().items())


IDLE_WHY = (
    "changes no sharding that propagation decides: XLA partitions the step as it does without it, so it saves nothing"
)
# See `planner.targets`: a target whose compiler lends an output's allocation until the output is written.
UNCLAIMED_OUTPUT_WHY = (
    "{}'s compiler lends an output's allocation to its prefetches until the output is written, so returning "
    "this gradient smaller gives the bytes back to its heap; the model does not size that, so no saving is "
    "claimed (check it with --verify)"
)


# A step captured without part of what trains (`Manifest.left_out`: the optimizer's update) returns what that
# part would read, sharded as nothing reads it: in the step that trains, the update's reads decide those
# shardings, so what a placement saves on the partial step is not what it saves there. Applied, a gradient pin
# of such a plan saved 0 of the 40 MiB it claimed on a transformers step with AdamW.
PARTIAL_STEP_WHY = (
    "the step planned leaves out {}, which decides how the step that trains shards what this changes, so its "
    "saving there is unknown: not recommended (alone, on the partial step: {} -> {})"
)
PARTIAL_STEP_WARNING = (
    "planned without {}: HBM per chip is of the partial step, and no placement is recommended from it; plan the "
    "whole step (auto_plan(..., optimizer=optimizer), or gradients_only=True for a step that has no update) for "
    "a change set to apply"
)


# A torch_xla step is changed only through what torch_xla lets its user write: a change set of other
# placements would be a claim nobody can apply.
NO_TORCH_XLA_HANDLE_WHY = (
    "torch_xla offers no way to apply it ({}), so it is not recommended for a torch_xla step (alone: {} -> {})"
)


def _no_torch_xla_handle(p: Placement) -> str | None:
    """Why torch_xla cannot apply `p`, or None when it can: pins are `mark_sharding_with_gradients` in the
    scanned body and `mark_sharding` on a gradient; a shard_as group has no handle."""
    if p.kind == SPLIT_SHARD_GROUP:
        return "torch_xla's scan numbers the shard_as groups of its backward itself"
    return None


def _manifest_pin(manifest: Manifest | None, position: int) -> tuple[str | None, tuple[AxisSpec, ...] | None]:
    """The parameter a manifest says output `position` is the gradient of, and its partition spec."""
    if manifest is None or position >= len(manifest.outputs) or manifest.outputs[position] is None:
        return None, None
    name = manifest.outputs[position]
    assert name is not None
    return name, tuple(manifest.parameter(name).partition_spec)


def _greedy(
    candidates: list[Placement],
    alone: dict[str, int],
    refused: dict[str, str],
    before: Simulation,
    simulate_with: Callable[[list[Placement]], Simulation],
) -> tuple[list[Placement], Simulation, dict[str, tuple[bool, str]]]:
    """Largest saving first; each kept only if it lowers the prediction with the ones kept before.

    `refused` names the candidates never kept, with the reason.
    """
    chosen: list[Placement] = []
    after = before
    verdicts: dict[str, tuple[bool, str]] = {}
    for p in sorted(candidates, key=lambda p: alone[p.id]):
        if p.id in refused:
            verdicts[p.id] = (False, refused[p.id])
            continue
        if alone[p.id] >= before.total:
            verdicts[p.id] = (
                False,
                f"alone it does not lower predicted HBM per chip ({_mb(before.total)} -> {_mb(alone[p.id])})",
            )
            continue
        trial = simulate_with([*chosen, p])
        if trial.total < after.total:
            chosen.append(p)
            verdicts[p.id] = (
                True,
                f"predicted HBM per chip {_mb(after.total)} -> {_mb(trial.total)}"
                f" (alone: {_mb(before.total)} -> {_mb(alone[p.id])})",
            )
            after = trial
        else:
            verdicts[p.id] = (
                False,
                f"alone it lowers HBM per chip to {_mb(alone[p.id])}, but with the "
                f"placements above it does not ({_mb(after.total)} -> {_mb(trial.total)})",
            )
    return chosen, after, verdicts


def _partitioner_note(module: HloModule) -> str:
    return partitioner_of(module)


def _check_manifest(module: HloModule, manifest: Manifest) -> None:
    root = module.entry.root
    count = len(root.operands) if root.opcode == "tuple" else 1
    if len(manifest.outputs) != count:
        raise ValueError(f"the manifest names {len(manifest.outputs)} outputs but the module returns {count}")


def _timeline(sim: Simulation) -> list[TimelineSeries]:
    """Bytes live per device over program order, from the simulation's own memory model."""
    return [TimelineSeries(**asdict(t)) for t in memory_timeline(sim.prepared, sim.result, sim.estimate)]


def _mb(n: int) -> str:
    return format_bytes(n)


def _alternative_why(before: int, greedy: int, everything: int, noise_bytes: int) -> str:
    """Why pinning every scanned parameter, which changes shardings, is (or is not) the recommendation."""
    if everything > before:
        more = _mb(everything - before)
        if _mb(everything) == _mb(before):  # a difference too small to show in the totals' unit
            return f"costs {more} more per chip instead of saving memory ({_mb(before)} per chip either way)"
        return f"costs {more} more per chip instead of saving memory: {_mb(before)} -> {_mb(everything)} per chip"
    if everything == before:
        return f"saves nothing: {_mb(before)} per chip either way"
    if everything > greedy + noise_bytes:
        return f"saves less than the placements that pay off one by one: {_mb(everything)} vs {_mb(greedy)} per chip"
    if everything >= greedy:
        return (
            f"saves as much as the placements that pay off one by one ({_mb(everything)} vs {_mb(greedy)} per "
            f"chip, within {_mb(noise_bytes)}) and pins each gradient itself, so it is the recommendation"
        )
    return (
        f"saves more than the placements that pay off one by one ({_mb(everything)} vs {_mb(greedy)} "
        f"per chip), so it is the recommendation"
    )


def _unwritable(
    u: Unwritable, names: NameTable, framework: str, mesh: Mesh | None, resolve: Callable[[str], str]
) -> PlacementInfo:
    """A placement the module as written has no instruction for: listed, not recommended, with no HLO edit and
    the reason (its user-level form, where there is one, is still what the user would write)."""
    info = _placement(u.placement, None, False, u.reason, names, framework, mesh, resolve)
    info.annotations = []
    return info


def _every_pin_why(idle: bool, left_out: str | None, before: int, greedy: int, everything: int, noise: int) -> str:
    """Why pinning every scanned parameter is, or is not, the change set."""
    if idle:
        return IDLE_WHY
    if left_out is not None:
        return PARTIAL_STEP_WHY.format(left_out, _mb(before), _mb(everything))
    return _alternative_why(before, greedy, everything, noise)


def _without_unwritable(unwritable: list[Unwritable]) -> str:
    """What pinning every scanned parameter leaves out: the pins the module as written cannot express."""
    if not unwritable:
        return ""
    ids = ", ".join(u.placement.id for u in unwritable)
    return f"; it leaves out {ids}, which the module as written has no instruction for"


def _placement(
    p: Placement,
    alone: int | None,
    recommended: bool,
    why: str,
    names: NameTable,
    framework: str,
    mesh: Mesh | None,
    resolve: Callable[[str], str],
) -> PlacementInfo:
    """`p` for the plan; `resolve` takes its annotations' names (the module as written) to the names of the
    module the name table was built on."""
    pinned = names.pinned(resolve(a.instruction) for a in p.annotations)
    torch = None
    if p.torch_pin is not None:
        torch = TorchPinInfo(
            parameter=p.torch_pin.parameter,
            partition_spec=list(p.torch_pin.partition_spec),
            shape=list(p.torch_pin.shape),
            call=p.torch_pin.call,
        )
    return PlacementInfo(
        id=p.id,
        kind=p.kind,
        summary=p.summary,
        fixes=list(p.fixes),
        annotations=[
            AnnotationInfo(
                computation=a.computation,
                instruction=a.instruction,
                sharding=a.sharding,
                unspecified_dims=list(a.unspecified_dims),
                shard_as=a.shard_as,
            )
            for a in p.annotations
        ],
        torch=torch,
        shard_as_pairs=[list(pair) for pair in p.torch_pairs],
        predicted_total_alone=alone,
        recommended=recommended,
        why=why,
        names=pinned,
        user=_user(p, framework, mesh, pinned),
    )


def _user(p: Placement, framework: str, mesh: Mesh | None, names: list[str]) -> UserPlacementInfo | None:
    form = user_form(p, framework, mesh, names)
    if form is None:
        return None
    return UserPlacementInfo(
        framework=form.framework,
        parameter=form.parameter,
        partition_spec=list(form.partition_spec) if form.partition_spec is not None else None,
        spec=form.spec_text,
        summary=form.summary,
        where=form.where,
        code=form.code,
        missing=form.missing,
    )


def _finding(
    before: Simulation, after: Simulation, finding: Finding, mesh: Mesh, names: NameTable, compiler_only: str | None
) -> FindingInfo:
    cause = root_cause(before.module, before.result, finding.instruction, mesh)
    info = FindingInfo(**asdict(finding), compiler_only=compiler_only)
    if cause is not None:
        info.root_cause = RootCauseInfo(**{**asdict(cause), "dropped_axes": list(cause.dropped_axes)})
    if finding.kind == GRADIENT_OUTPUT:
        return _output_finding(before, after, finding, info, names, mesh)
    info.name = names.element(finding.loop, finding.index)
    carried = before.module.instruction(finding.loop).shape
    element = carried.leaves()[finding.index]
    now = leaf_shardings(carried, before.result.sharding(finding.loop))[finding.index]
    if isinstance(element, ArrayShape):
        info.shard_shape = _shard_shape(element.dims, now)
    loop = after.module.instruction(finding.loop)
    leaf = loop.shape.leaves()[finding.index]
    planned = leaf_shardings(loop.shape, after.result.sharding(finding.loop))[finding.index]
    if isinstance(leaf, ArrayShape):
        info.per_device_bytes_after = per_device_bytes(leaf, planned)
    if isinstance(element, ArrayShape) and isinstance(leaf, ArrayShape):
        info.split = _split(f"{finding.loop}[{finding.index}]", element.dims, now, leaf.dims, planned, mesh)
    return info


def _split(
    name: str,
    dims: tuple[int, ...],
    now: HloSharding | None,
    dims_after: tuple[int, ...],
    planned: HloSharding | None,
    mesh: Mesh,
) -> SplitPictureInfo:
    """The picture of a finding's split, now and after the plan."""
    return SplitPictureInfo(
        mesh=mesh.to_text(),
        now=TensorSplitInfo.model_validate(asdict(tensor_split(name, dims, now, mesh))),
        planned=TensorSplitInfo.model_validate(asdict(tensor_split(name, dims_after, planned, mesh))),
    )


def _output_finding(before: Simulation, after: Simulation, finding: Finding, info: FindingInfo,
                    names: NameTable, mesh: Mesh) -> FindingInfo:  # fmt: skip
    """A returned gradient: its entry output before and after the plan."""
    param = before.module.entry[finding.matched_parameter or ""]
    parameter = names.gradient_output(finding.index) or names.parameter(param.parameter_number or 0)
    info.name = f"grad of {parameter}" if parameter else None
    value = before.module.entry[finding.instruction]
    if isinstance(value.shape, ArrayShape):
        now = before.result.sharding(value.name)
        info.shard_shape = _shard_shape(value.shape.dims, now)
        returned = after.module.entry.root.operands[finding.index]
        planned = after.result.sharding(returned)
        info.per_device_bytes_after = per_device_bytes(value.shape, planned)
        key = f"{finding.loop}[{finding.index}]"
        info.split = _split(key, value.shape.dims, now, value.shape.dims, planned, mesh)
    return info


def _shard_shape(dims: tuple[int, ...], sharding: HloSharding | None) -> list[int]:
    """The per-device shape: [8,1024,1024] under {devices=[1,4,2]<=[8]} is [8,256,512]."""
    return list(sharding.shard_shape(dims) if sharding is not None and sharding.is_tiled else dims)


def _buffer(line: BufferLine, names: NameTable) -> BufferInfo:
    info = BufferInfo(**asdict(line))
    info.name = names.value(line.instruction) or line.name
    # The per-device array the holder keeps, as the memory model has it (a partitioner's buffer is per
    # device already: its shape is not divided again).
    info.shard_shape = list(line.shard_shape) if line.shard_shape else None
    return info


def per_device_while_shapes(sim: Simulation) -> dict[str, str]:
    """Each While's carried tuple per device, printed like XLA's partitioned module."""
    shapes = {}
    for loop in sim.prepared.loops:
        shardings = leaf_shardings(loop.instruction.shape, sim.result.sharding(loop.name))
        parts = []
        for leaf, s in zip(loop.instruction.shape.leaves(), shardings):
            dims = s.shard_shape(leaf.dims) if s is not None and s.is_tiled else leaf.dims
            parts.append(f"{leaf.element_type}[{','.join(map(str, dims))}]")
        shapes[loop.name] = f"({', '.join(parts)})"
    return shapes


def _loops(before: Simulation, after: Simulation) -> list[LoopInfo]:
    shapes_before, shapes_after = per_device_while_shapes(before), per_device_while_shapes(after)
    loops = []
    for loop in before.prepared.loops:
        shardings = leaf_shardings(loop.instruction.shape, before.result.sharding(loop.name))
        carried = sum(per_device_bytes(leaf, s) for leaf, s in zip(loop.instruction.shape.leaves(), shardings))
        loops.append(
            LoopInfo(
                name=loop.name,
                computation=loop.computation,
                trip_count=loop.trip_count,
                tuple_arity=loop.tuple_arity,
                carried_bytes_per_device=carried,
                per_device_shape=shapes_before[loop.name],
                per_device_shape_after=shapes_after.get(loop.name, shapes_before[loop.name]),
            )
        )
    return loops
