"""Next steps for a MaxText step that does not fit, each predicted by lowering MaxText's own step with the
overrides and planning it.

A MaxText step pins its activations' shardings (its logical axis rules): a smaller batch or a bigger mesh is not
a change of shardings the engine can write into the lowered module (`planner.plan.fixes.next_steps` does that for
steps that leave their activations to propagation). MaxText builds the changed step itself from the overrides, in
seconds without compiling it, so each candidate is the real step lowered and planned:
- **more chips**: the topology doubled (then x4, x8, ...), the added chips on `ici_fsdp_parallelism` (on
  `dcn_fsdp_parallelism` once past one slice), `per_device_batch_size` divided alike so the global batch holds;
- **a smaller batch**: `per_device_batch_size` halved (then /4, /8, ...), while the global batch is a whole row;
- **remat**: `remat_policy=full` (only the layers' inputs saved), when the step saves more.
Each search stops at the first candidate that fits; the last tried is reported when none does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.progress import note
from scan_runtime.maxtext.planning import MaxTextPlan
from scan_runtime.maxtext.terms import ICI_KEYS, MaxTextStep, mesh_axes, number, topology_of, with_overrides

MAX_FACTOR = 16  # chips x16, or the batch /16, at most
FSDP = "fsdp"


@dataclass(frozen=True)
class MaxTextNextStep:
    kind: str  # more-chips, smaller-batch or remat
    overrides: tuple[str, ...]
    total_bytes: int | None  # HBM per chip of the step with the overrides, as planned; None: not predicted
    call: str  # fits, does not fit, too close to call; or why it was not predicted
    hlo: str | None = None  # the step lowered with the overrides (`lowered.as_text(dialect="hlo")`)
    tried: tuple[MaxTextNextStep, ...] = ()  # the candidates before it, which did not fit

    @property
    def fits(self) -> bool:
        return self.call == "fits"


# Plans the step that `train_compile`'s arguments (the user's, with overrides replaced) describe.
PlanArguments = Callable[[Sequence[str]], MaxTextPlan]


def more_chips(step: MaxTextStep, axes: dict[str, int], factor: int) -> list[str]:
    topology, slices = topology_of(step.chip, step.chips * factor)
    overrides = [f"compile_topology={topology}", f"compile_topology_num_slices={slices}"]
    if slices > 1:
        overrides.append(f"dcn_fsdp_parallelism={slices}")
        overrides.append(f"{ICI_KEYS[FSDP]}={axes.get(FSDP, 1) * factor // slices}")
    else:
        overrides.append(f"{ICI_KEYS[FSDP]}={axes.get(FSDP, 1) * factor}")
    return [*overrides, f"per_device_batch_size={number(step.per_device_batch_size / factor)}"]


def smaller_batch(step: MaxTextStep, factor: int) -> list[str] | None:
    """`per_device_batch_size` divided by `factor`, or None once the global batch would be less than a row."""
    per_chip = step.per_device_batch_size / factor
    if per_chip * step.chips < 1:
        return None
    return [f"per_device_batch_size={number(per_chip)}"]


def next_steps(base: MaxTextPlan, plan_arguments: PlanArguments) -> list[MaxTextNextStep]:
    """The three options for a step that does not fit, each the first candidate that fits (or the last tried)."""
    step = base.step
    axes = mesh_axes(base.plan.mesh)
    found = [
        _first_that_fits("more-chips", [more_chips(step, axes, f) for f in _factors()], step, plan_arguments),
        _first_that_fits(
            "smaller-batch", [o for o in (smaller_batch(step, f) for f in _factors()) if o], step, plan_arguments
        ),
    ]
    if step.remat_policy != "full":
        found.append(_first_that_fits("remat", [["remat_policy=full"]], step, plan_arguments))
    else:
        found.append(MaxTextNextStep("remat", (), None, "remat_policy=full already: only the layers' inputs are saved"))
    return found


def _factors() -> list[int]:
    return [2**k for k in range(1, MAX_FACTOR.bit_length())]


def _first_that_fits(
    kind: str, candidates: list[list[str]], step: MaxTextStep, plan_arguments: PlanArguments
) -> MaxTextNextStep:
    if not candidates:
        return MaxTextNextStep(kind, (), None, "no candidate: the global batch is already one row")
    tried: MaxTextNextStep | None = None
    before: list[MaxTextNextStep] = []
    for overrides in candidates:
        if tried is not None:
            before.append(tried)
        note(f"lowering and planning the step with {' '.join(overrides)}")
        try:
            planned = plan_arguments(with_overrides(step, overrides))
        except (ValueError, RuntimeError) as e:
            # MaxText refuses some configurations (a batch that does not divide over the mesh): said, not hidden.
            tried = MaxTextNextStep(
                kind, tuple(overrides), None, f"MaxText refuses it: {_first_line(e)}", None, tuple(before)
            )
            continue
        verdict = planned.plan.verdict
        call = verdict.call_after if verdict is not None else "no capacity"
        tried = MaxTextNextStep(kind, tuple(overrides), planned.plan.hbm.total_after, call, planned.hlo, tuple(before))
        if tried.fits:
            break
    assert tried is not None
    return tried


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:150] if text else type(e).__name__


__all__ = ["MaxTextNextStep", "more_chips", "next_steps", "smaller_batch"]
