"""When a compiler confirms a claimed saving, and what a plan says when it does not.

A change set is recommended for the bytes it saves. A compiler confirms it when the saving it
measures (its bytes per chip without the change set, minus with it) is positive and at least
`CONFIRMED_SHARE` of the saving predicted: a plan may over-claim a little, never mostly. A change set
predicted to save nothing is confirmed by a compiler that measures no loss.

A worked example, the CI language-model step on a v6e:2x4 slice, as its TPU plan stood when it also
pinned the returned embedding and head gradients: predicted 380.0 -> 291.5 MiB (88.5 saved), XLA:TPU
370.8 -> 347.0 MiB (23.9 saved): 27% of the claim, not confirmed. Its plan now pins only the stacked
gradients: 64.5 MiB predicted, 56.0 measured, 87%, confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.plan.model import Verification
from planner.plan.verdict import Measured
from planner.units import format_bytes

CONFIRMED_SHARE = 0.7


def confirms(predicted_saving_bytes: int, measured_saving_bytes: int) -> bool:
    """Whether a measured saving backs the predicted one."""
    if predicted_saving_bytes <= 0:
        return measured_saving_bytes >= 0
    return measured_saving_bytes > 0 and measured_saving_bytes >= CONFIRMED_SHARE * predicted_saving_bytes


def unconfirmed_reason(compiler: str, predicted_saving_bytes: int, measured_saving_bytes: int) -> str:
    """Why a recommendation is withdrawn: what the compiler measured against the claim."""
    if measured_saving_bytes <= 0:
        measured = "saves nothing" if measured_saving_bytes == 0 else f"costs {format_bytes(-measured_saving_bytes)}"
    else:
        share = measured_saving_bytes / predicted_saving_bytes
        measured = f"saves {format_bytes(measured_saving_bytes)}, {share:.0%} of the claim"
    return (
        f"{compiler} does not confirm it: predicted to save {format_bytes(predicted_saving_bytes)} per chip, "
        f"{compiler} {measured} (a recommendation needs at least {CONFIRMED_SHARE:.0%} of its claim)"
    )


@dataclass(frozen=True)
class TargetCompile:
    """What the compiler the plan is for measured, beside what the plan predicted for it."""

    compiler: str
    given_bytes: int  # the module as given
    before_bytes: int  # its inlined form, the one the change set is written into
    after_bytes: int  # that form with the change set
    predicted_saving_bytes: int

    @property
    def saving_bytes(self) -> int:
        return self.before_bytes - self.after_bytes


def target_compile(checked: Verification, compiler: str) -> TargetCompile | None:
    """XLA:CPU's numbers for a CPU plan, XLA:TPU's for a TPU plan; None when that compiler did not compile."""
    if compiler == "cpu":
        name = "torch_xla's XLA:CPU" if checked.frontend == "torch_xla" else "XLA:CPU"
        given, before, after = checked.given_total_bytes, checked.before_total_bytes, checked.after_total_bytes
        predicted = checked.predicted_saving_bytes
    elif checked.tpu is not None and checked.tpu.predicted_before_bytes is not None:
        tpu, predicted_before = checked.tpu, checked.tpu.predicted_before_bytes
        name, given, before, after = (
            f"XLA:TPU ({tpu.topology})",
            tpu.given_total_bytes,
            tpu.before_total_bytes,
            tpu.after_total_bytes,
        )
        predicted = predicted_before - (tpu.predicted_after_bytes or 0)
    else:
        return None
    return TargetCompile(name, given if given is not None else before, before, after, predicted)


def confirmation(checked: Verification, compiler: str) -> tuple[bool | None, str | None]:
    """Whether the compiler the plan is for confirms its saving (None: it did not compile), and the reason to
    withdraw the recommendation when it does not."""
    found = target_compile(checked, compiler)
    if found is None:
        return None, None
    if confirms(found.predicted_saving_bytes, found.saving_bytes):
        return True, None
    return False, unconfirmed_reason(found.compiler, found.predicted_saving_bytes, found.saving_bytes)


def measured_by_target(checked: Verification, compiler: str, withdrawn: bool) -> Measured | None:
    """The bytes the plan's own compiler measured for the step as given and with the change set (as given again
    when the change set was withdrawn); None when that compiler did not compile it."""
    found = target_compile(checked, compiler)
    if found is None:
        return None
    return Measured(found.compiler, found.given_bytes, found.given_bytes if withdrawn else found.after_bytes)
