"""The plan, as the API returns it: what is wrong, why, what to annotate, what it buys.

Byte quantities are per device (HBM per chip), in the terms of XLA's compiled
memory statistics: arguments + outputs + temporaries - aliased bytes.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class LoopInfo(BaseModel):
    name: str
    computation: str
    trip_count: int | None
    tuple_arity: int
    carried_bytes_per_device: int
    per_device_shape: str = Field(description="the carried tuple per device, as XLA's partitioned While prints it")
    per_device_shape_after: str = Field(description="the same after the recommended placements")


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


class FindingInfo(BaseModel):
    kind: str = Field(description="stacked-gradient or large-buffer")
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


class HbmInfo(BaseModel):
    backend: str = Field(default="cpu", description="the compiler predicted: cpu (XLA:CPU) or a TPU chip preset")
    capacity_bytes: int | None
    per_chip_before: dict[str, int]
    per_chip_after: dict[str, int]
    total_before: int
    total_after: int
    breakdown_before: dict[str, int] = Field(description="bytes live at the peak, by what holds them")
    breakdown_after: dict[str, int]
    top_buffers_before: list[BufferInfo] = Field(default_factory=list, description="largest buffers live at the peak")
    top_buffers_after: list[BufferInfo] = Field(default_factory=list)

    @property
    def saved_bytes(self) -> int:
        return self.total_before - self.total_after


class TpuVerification(BaseModel):
    xla: str = Field(description="libtpu's XLA:TPU, compiling ahead of time with no TPU attached")
    topology: str = Field(description="the slice compiled for, e.g. v6e:2x4")
    before_total_bytes: int
    after_total_bytes: int
    xla_saving_bytes: int


class Verification(BaseModel):
    xla: str = Field(description="the XLA that compiled both modules")
    num_devices: int
    before_total_bytes: int
    after_total_bytes: int
    predicted_saving_bytes: int
    xla_saving_bytes: int
    after_while_shapes: list[str]
    stacked_gradients_at_shard: bool
    gradient_mismatches: list[str] = Field(description="stacked gradients XLA keeps larger than their shard")
    tpu: TpuVerification | None = Field(
        default=None, description="XLA:TPU's bytes per chip for both modules, for a TPU chip preset with libtpu"
    )
    seconds: float


class Plan(BaseModel):
    module: str
    num_partitions: int | None
    mesh: str | None
    partitioner: str = Field(
        default="gspmd",
        description="the partitioner the module was written for (`shardy, simulated with GSPMD rules` for Shardy)",
    )
    loops: list[LoopInfo]
    hbm: HbmInfo
    findings: list[FindingInfo]
    conflicts: list[ConflictInfo]
    placements: list[PlacementInfo]
    alternatives: list[AlternativeInfo] = Field(default_factory=list)
    verification: Verification | None = None
