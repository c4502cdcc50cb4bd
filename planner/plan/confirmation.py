"""When a compiler confirms a claimed saving, and what a plan says when it does not.

A change set is recommended for the bytes it saves. A compiler confirms it when the saving it
measures (its bytes per chip without the change set, minus with it) is positive and at least
`CONFIRMED_SHARE` of the saving predicted: a plan may over-claim a little, never mostly. A change set
predicted to save nothing is confirmed by a compiler that measures no loss.

A worked example, the CI language-model step on a v6e:2x4 slice: predicted 380.0 -> 291.5 MiB (88.5
saved), XLA:TPU 370.8 -> 346.9 MiB (23.9 saved): 27% of the claim, not confirmed.
"""

from __future__ import annotations

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
