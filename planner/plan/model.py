"""The plan, as the API returns it: what is wrong, why, what to annotate, what it buys.

Byte quantities are per device (HBM per chip), in the terms of XLA's compiled
memory statistics: arguments + outputs + temporaries - aliased bytes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, computed_field, model_validator

from planner.errors import UnreadableModule, Unverifiable, VerifyCause
from planner.plan.chip_bytes import PerChipBytes


class LoopInfo(BaseModel):
    name: str
    computation: str
    trip_count: int | None
    tuple_arity: int
    carried_bytes_per_device: int
    per_device_shape: str = Field(description="the carried tuple per device, as XLA's partitioned While prints it")
    per_device_shape_after: str = Field(description="the same after the recommended placements")


class DimSplitInfo(BaseModel):
    size: int
    axes: list[str] = Field(description="mesh axes the dim is split over, major first; `x4` when no axis names it")


class TensorSplitInfo(BaseModel):
    """How a tensor is split over the mesh, dim by dim."""

    name: str
    dims: list[DimSplitInfo]
    shard_shape: list[int] = Field(description="the per-device shape")
    replicated_over: list[str] = Field(description="mesh axes no dim is split over: each holds a copy")


class SplitPictureInfo(BaseModel):
    """A finding's tensor against the mesh axes, now and once the plan is applied."""

    mesh: str = Field(description="the mesh the axes are named from, e.g. fsdp=4,tp=2")
    now: TensorSplitInfo
    planned: TensorSplitInfo | None = None


class RootCauseInfo(BaseModel):
    instruction: str
    opcode: str
    source: str | None = Field(description="file:line (op name) from the instruction's metadata, when the dump has it")
    notation: str = Field(
        description="operands -> result, each dim as size_axes (the mesh axes it is split over), e.g. "
        "a[1024_tp, 256_fsdp] . b[256_fsdp, 4096_tp] -> c[1024_tp, 4096]"
    )
    tiles_before: int
    tiles_after: int
    dropped_axes: list[str]
    operands: list[TensorSplitInfo] = Field(default_factory=list, description="the op's array operands, split")
    result: TensorSplitInfo | None = Field(default=None, description="the op's result, split as propagated")


class FindingInfo(BaseModel):
    kind: str = Field(description="stacked-gradient, accumulated-gradient, large-buffer or gradient-output")
    loop: str
    index: int = Field(description="element of the While's carried tuple")
    instruction: str = Field(description="the body instruction producing the element each iteration")
    shape: str
    current_sharding: str
    ideal_sharding: str | None
    per_device_bytes: int
    ideal_per_device_bytes: int
    waste_bytes: int = Field(description="bytes per chip above the ideal")
    matched_parameter: str | None
    per_device_bytes_after: int | None = Field(
        default=None, description="the buffer's bytes per chip once the recommended placements are applied"
    )
    root_cause: RootCauseInfo | None = None
    name: str | None = Field(
        default=None,
        description="the user's name for the buffer, e.g. `grad of params['wq']`, when the dump's metadata or the "
        "client's parameter names give one",
    )
    shard_shape: list[int] | None = Field(
        default=None, description="the buffer's per-device shape under its current sharding, e.g. [8,256,512]"
    )
    split: SplitPictureInfo | None = Field(
        default=None, description="the buffer's dims against the mesh axes, now and after the plan"
    )
    compiler_only: str | None = Field(
        default=None,
        description="on a TPU chip, when XLA:CPU decides otherwise for this buffer: what it does, and which of "
        "XLA:TPU's passes make the difference",
    )


class GroupMemberInfo(BaseModel):
    instruction: str
    source: str | None
    wanted: str = Field(description="its sharding when propagated without the group")
    forced: str = Field(description="its sharding with the group, as XLA decides it")


class ConflictInfo(BaseModel):
    group: int
    members: list[GroupMemberInfo]


class AnnotationInfo(BaseModel):
    computation: str
    instruction: str
    sharding: str | None = Field(description="Sharding custom-call inserted after the instruction")
    unspecified_dims: list[int] = Field(description="dims of that Sharding left for propagation to decide")
    shard_as: int | None = Field(description="new shard_as group id for the instruction")


class TorchPinInfo(BaseModel):
    parameter: str = Field(description="the parameter's name inside the scanned layer, e.g. `mlp.down.weight`")
    partition_spec: list[str | list[str] | None]
    shape: list[int] = Field(default_factory=list, description="the parameter's shape in one layer")
    call: str = Field(description="what to call on it inside the scanned function")


class UserPlacementInfo(BaseModel):
    """A placement as the user writes it in the framework that wrote the step."""

    framework: str = Field(description="jax (MaxText's steps too) or torch_xla")
    parameter: str | None = Field(
        description="the user's name for the parameter pinned (or whose gradient is), e.g. `params['w_down']`"
    )
    partition_spec: list[str | list[str] | None] | None = Field(
        description="per dim of one layer's slice (a returned gradient: of the whole), over the mesh's axis names"
    )
    spec: str | None = Field(description="the spec as the framework writes it, e.g. `P('tp', 'fsdp')`")
    summary: str = Field(description="the placement in a line, by the parameter's name and spec where known")
    where: str = Field(description="where in the user's code the line goes")
    code: str | None = Field(description="the line to paste, e.g. `w = jax.lax.with_sharding_constraint(...)`")
    missing: str | None = Field(default=None, description="why there is no line, when there is none")


class PlacementInfo(BaseModel):
    id: str
    kind: str = Field(description="pin-parameter or split-shard-group")
    summary: str
    fixes: list[str] = Field(description="the findings (loop[index]) or shard_as groups it addresses")
    annotations: list[AnnotationInfo] = Field(description="HLO-level: the edits that make the patched module")
    torch: TorchPinInfo | None = Field(default=None, description="PyTorch-level, when a manifest names the parameter")
    shard_as_pairs: list[list[str]] = Field(default_factory=list, description="pairs a split leaves tied")
    predicted_total_alone: int | None = Field(
        description="HBM per chip predicted with this placement alone (when it was tried alone)"
    )
    recommended: bool
    why: str = Field(description="why the placement is (or is not) recommended, in predicted bytes")
    names: list[str] = Field(
        default_factory=list,
        description="the user's names of what it pins, e.g. `params['wq']`, `grad of params['wq']`",
    )
    user: UserPlacementInfo | None = Field(
        default=None, description="the placement in the user's framework: name, PartitionSpec and a line to paste"
    )

    @property
    def in_words(self) -> str:
        """The placement in the user's words where the plan has them, else its HLO summary."""
        return self.user.summary if self.user is not None else self.summary


class AlternativeInfo(BaseModel):
    name: str
    placements: list[str]
    predicted_total: int
    recommended: bool
    why: str


class BufferInfo(BaseModel):
    instruction: str
    computation: str
    category: str
    shape: str
    sharding: str
    per_device_bytes: int
    stacked: bool = Field(description="an [L, ...] buffer carried by a loop of L trips")
    name: str | None = Field(default=None, description="the user's name for the buffer, when one is known")
    shard_shape: list[int] | None = Field(default=None, description="the buffer's per-device shape")


class HbmInfo(BaseModel):
    backend: str = Field(default="cpu", description="the compiler predicted: cpu (XLA:CPU) or a TPU chip preset")
    capacity_bytes: int | None
    # Grouped by value in JSON (`planner.plan.chip_bytes`): one entry per distinct value, not one per chip.
    per_chip_before: PerChipBytes
    per_chip_after: PerChipBytes
    total_before: int
    total_after: int
    breakdown_before: dict[str, int] = Field(description="bytes live at the peak, by what holds them")
    breakdown_after: dict[str, int]
    top_buffers_before: list[BufferInfo] = Field(default_factory=list, description="largest buffers live at the peak")
    top_buffers_after: list[BufferInfo] = Field(default_factory=list)
    host_before: int = Field(default=0, description="bytes per chip in host memory (host offload), not in HBM")
    host_after: int = 0

    @property
    def saved_bytes(self) -> int:
        return self.total_before - self.total_after


class TpuVerification(BaseModel):
    xla: str = Field(description="libtpu's XLA:TPU, compiling ahead of time with no TPU attached")
    topology: str = Field(description="the slice compiled for, e.g. v6e:2x4")
    given_total_bytes: int | None = Field(
        default=None, description="the module as given (before_total_bytes is its inlined form)"
    )
    before_total_bytes: int
    after_total_bytes: int
    xla_saving_bytes: int
    predicted_before_bytes: int | None = Field(default=None, description="our prediction for this chip's compiler")
    predicted_after_bytes: int | None = None


class Verification(BaseModel):
    xla: str = Field(description="the XLA that compiled both modules")
    frontend: str = Field(default="jax", description="torch_xla (compiled by torch_xla's own XLA) or jax (by jaxlib)")
    partitioner: str = Field(
        default="gspmd", description="the partitioner XLA compiled with: the one the module names (gspmd or shardy)"
    )
    num_devices: int
    given_total_bytes: int | None = Field(default=None, description="the module as given, calls and all")
    before_total_bytes: int = Field(
        description="the module with its calls inlined, the form the placements are "
        "written into; the saving is this minus after_total_bytes"
    )
    after_total_bytes: int
    predicted_saving_bytes: int = Field(description="our predicted saving for the compiler verified (XLA:CPU)")
    xla_saving_bytes: int
    predicted_before_bytes: int | None = Field(default=None, description="our prediction for XLA:CPU, before")
    predicted_after_bytes: int | None = None
    after_while_shapes: list[str]
    stacked_gradients_at_shard: bool
    gradient_mismatches: list[str] = Field(description="stacked gradients XLA keeps larger than their shard")
    gradient_check: str | None = Field(
        default=None, description="why the stacked gradients could not be checked, when they could not"
    )
    tpu: TpuVerification | None = Field(
        default=None, description="XLA:TPU's bytes per chip for both modules, for a TPU chip preset with libtpu"
    )
    tpu_skipped: str | None = Field(default=None, description="why XLA:TPU did not verify, for a TPU chip preset")
    confirmed: bool | None = Field(
        default=None,
        description="whether the compiler the plan is for measures at least 70% of the predicted saving "
        "(None: that compiler did not compile)",
    )
    seconds: float

    def prediction_error(self) -> float | None:
        """Our prediction of the step as given against what this compile measured, signed: (ours - XLA) / XLA."""
        if self.predicted_before_bytes is None or self.before_total_bytes <= 0:
            return None
        return self.predicted_before_bytes / self.before_total_bytes - 1


class VerifyNotRun(BaseModel):
    """`--verify` was asked and compiled nothing to compare: why, as a cause a client can act on and as the
    line a person reads. The plan stands without it."""

    cause: VerifyCause = Field(
        description="no-faithful-compile (parameters torch_xla or this machine cannot hold, a module the conversion "
        "cannot keep), compiler-missing (jaxlib, torch_xla or libtpu not installed), unreadable-module (the "
        "installed jaxlib cannot read the module's text, as text a newer jax writes) or compile-failed (XLA failed "
        "or ran out of time)"
    )
    reason: str = Field(description="why, in one line: what the CLI prints after `not verified:`")
    written_by: str | None = Field(
        default=None, description="unreadable-module: the jax release that wrote the module, e.g. `jax 0.12`"
    )
    jaxlib: str | None = Field(default=None, description="unreadable-module: the jaxlib installed where it was planned")
    install: str | None = Field(default=None, description="unreadable-module: what to install to verify the module")

    @classmethod
    def of(cls, e: Unverifiable) -> VerifyNotRun:
        if isinstance(e, UnreadableModule):
            return cls(cause=e.cause, reason=str(e), written_by=e.written_by, jaxlib=e.jaxlib, install=e.install)
        return cls(cause=e.cause, reason=str(e))


class VerdictInfo(BaseModel):
    """Whether the step fits, before and after the recommended change set: the first thing a report says."""

    capacity_bytes: int | None = Field(description="the chip's HBM; None when no chip or --hbm was given")
    chip: str | None = Field(default=None, description="the chip preset, when one was given")
    fits_before: bool | None = Field(
        description="worst chip within capacity before the plan (None: no capacity, or too close to call)"
    )
    fits_after: bool | None
    call_before: str = Field(default="no capacity", description="fits, does not fit, too close to call or no capacity")
    call_after: str = Field(default="no capacity")
    error_band: list[float] | None = Field(
        default=None,
        description="[under, over]: the model's signed error on this kind of step, (ours - compiler) / compiler, "
        "widened by the verdict's margin; a verdict is said only where it holds across it",
    )
    error_band_kind: str | None = Field(default=None, description="the kind of step the band was measured on")
    measured_by: str | None = Field(default=None, description="the compiler whose measured bytes decided the verdict")
    verify_command: str | None = Field(default=None, description="what to run when the verdict is too close to call")
    worst_chip_before: str = Field(description="the chip (device id) holding the most bytes before the plan")
    worst_before_bytes: int
    worst_chip_after: str
    worst_after_bytes: int
    margin_before_bytes: int | None = Field(description="capacity - worst chip's bytes; negative when over")
    margin_after_bytes: int | None
    change_set: list[str] = Field(description="ids of the placements in the one recommended change set")
    change_set_name: str = Field(description="what the change set is, in words")
    saves_bytes: int = Field(description="what the change set buys per chip (worst chip)")
    summary: str = Field(description="the verdict in one line")


class PeakHolderInfo(BaseModel):
    """What holds the memory at the peak, by kind, after the plan."""

    kind: str = Field(description="saved-activations, stacked-gradients, parameters, optimizer-state, temporaries, "
                      "outputs or other")  # fmt: skip
    per_device_bytes: int
    items: list[str] = Field(default_factory=list, description="the largest buffers of this kind, named")


class NextStepInfo(BaseModel):
    """A change beyond sharding, predicted with the same simulator."""

    kind: str = Field(description="remat, more-fsdp-chips or smaller-microbatch")
    summary: str = Field(description="the change, concretely (e.g. `mesh fsdp=128,tp=4 (512 chips)`)")
    predicted_total: int = Field(description="HBM per chip predicted with the change on top of the plan")
    fits: bool | None
    settings: dict[str, str | int | float] = Field(
        default_factory=dict, description="the option's parameters, e.g. {'fsdp': 128} or {'microbatch_fraction': 0.5}"
    )


class TimelineSeries(BaseModel):
    """Bytes live per device over program order in one computation, as XProf's memory viewer draws it."""

    computation: str = Field(description="the entry or a loop body")
    label: str = Field(description="entry, or `body of while.953 (8 trips)`")
    positions: list[str] = Field(description="instruction names in program order (possibly subsampled)")
    live_bytes: list[int] = Field(description="bytes live per device after each position")
    peak_index: int


_SKIPPED = "verify_not_run's reason, the one line (null when verify ran or was not asked)"


class Plan(BaseModel):
    verdict: VerdictInfo | None = Field(default=None, description="fits / does not fit, before and after")
    warnings: list[str] = Field(default_factory=list, description="about the request, e.g. a mesh that looks swapped")
    module: str
    num_partitions: int | None
    mesh: str | None
    partitioner: str = Field(
        default="gspmd",
        description="the partitioner the module was written for and simulated with (`gspmd` or `shardy`)",
    )
    shardy_release: str | None = Field(
        default=None,
        description="under Shardy, whose Shardy's rules the simulation followed (the installed jaxlib's, "
        "else the newest the planner knows); null under GSPMD",
    )
    loops: list[LoopInfo]
    hbm: HbmInfo
    findings: list[FindingInfo]
    conflicts: list[ConflictInfo]
    placements: list[PlacementInfo]
    alternatives: list[AlternativeInfo] = Field(default_factory=list)
    peak_holders: list[PeakHolderInfo] = Field(
        default_factory=list, description="what holds the memory at the peak after the plan, by kind"
    )
    next_steps: list[NextStepInfo] = Field(
        default_factory=list, description="predicted options beyond sharding, when the plan still does not fit"
    )
    next_steps_unavailable: list[str] = Field(
        default_factory=list, description="options beyond sharding that could not be predicted for this step, and why"
    )
    timeline_before: list[TimelineSeries] = Field(default_factory=list)
    timeline_after: list[TimelineSeries] = Field(default_factory=list)
    verification: Verification | None = None
    withdrawn: str | None = Field(
        default=None,
        description="why the recommended change set was withdrawn: the compiler measured less than it claims",
    )
    verify_not_run: VerifyNotRun | None = Field(
        default=None, description="why --verify compiled nothing, when it was asked: the plan stands without it"
    )

    @computed_field(description=_SKIPPED)  # type: ignore[prop-decorator]
    @property
    def verification_skipped(self) -> str | None:
        return self.verify_not_run.reason if self.verify_not_run is not None else None

    @model_validator(mode="before")
    @classmethod
    def _reason_alone(cls, data: Any) -> Any:
        """A stored plan JSON that says why in `verification_skipped` alone held the one cause that field had:
        no faithful compile. It reads as that cause."""
        if isinstance(data, dict) and data.get("verification_skipped") and data.get("verify_not_run") is None:
            reason = data["verification_skipped"]
            return {**data, "verify_not_run": {"cause": "no-faithful-compile", "reason": reason}}
        return data
