"""What crosses the wire between the planner's clients and its service: one schema both import.

Requests (`PlanRequest` with its `MeshSpec` and `PlanOptions`, `JobRequest` with its `SearchSpec`), what the
service answers a client reads (`PlanRecord`, whose `plan` is `planner.plan.model.Plan`), and a configuration
search's report (`SearchReportBody`, `SearchRecord`). A request model refuses a field it does not have, naming
the nearest one it has. `PlannerUnavailable` and `PlannerRefused` are how a call over the wire ends when it
gets no plan.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from planner.memory import chip
from planner.memory.chips import check_hbm_bytes
from planner.mesh import Mesh
from planner.plan.manifest import Manifest
from planner.plan.model import Plan
from planner.targets import LIBTPU_RELEASE
from planner.version import planner_version


class PlannerUnavailable(RuntimeError):
    """The planner service could not be reached or did not answer in time."""


class PlannerRefused(RuntimeError):
    """The planner answered, and refused the request (bad HLO, a mesh that does not fit, ...)."""


_EXAMPLE_HLO = (
    "HloModule m, num_partitions=8\n\nENTRY e {\n  p = f32[8,1024]{1,0} parameter(0), "
    "sharding={devices=[4,2]<=[8]}\n  ROOT n = f32[8,1024]{1,0} negate(p)\n}\n"
)


# A byte count no chip comes near (1 EiB), and within the 64-bit integers the plan store keeps.
MAX_BYTES = 1 << 60
# How messages name HLO sent in a request's JSON (an uploaded file is named by its file name).
REQUEST_SOURCE = "request"


class RequestModel(BaseModel):
    """A request body's model: a field it does not have is refused, naming the nearest one it has
    (`unknown field 'mseh': did you mean 'mesh'?`), never ignored."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [name for name in data if name not in cls.model_fields]
            if unknown:
                raise PydanticCustomError("extra_forbidden", "{message}",
                                          {"message": unknown_fields(unknown, list(cls.model_fields))})  # fmt: skip
        return data


def unknown_fields(unknown: list[str], known: list[str]) -> str:
    """`unknown field 'mseh': did you mean 'mesh'?`; without a near name, the known ones."""
    near = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
    if len(unknown) == 1 and near[unknown[0]]:
        return f"unknown field {unknown[0]!r}: did you mean {near[unknown[0]][0]!r}?"
    named = ", ".join(f"{name!r} (did you mean {near[name][0]!r}?)" if near[name] else repr(name) for name in unknown)
    return f"unknown field{'s' if len(unknown) > 1 else ''} {named}; known: {', '.join(known)}"


class MeshSpec(RequestModel):
    shape: list[int] = Field(examples=[[4, 2]])
    axis_names: list[str] = Field(examples=[["fsdp", "tp"]])
    device_ids: list[int] | None = Field(default=None, description="row-major device ids; default 0..N-1")

    def to_mesh(self) -> Mesh:
        return Mesh(tuple(self.shape), tuple(self.axis_names), tuple(self.device_ids or ()))

    @model_validator(mode="after")
    def _valid(self) -> MeshSpec:
        self.to_mesh()  # raises with both offending values
        return self


class PlanOptions(RequestModel):
    threshold: float = Field(default=1.5, ge=1, description="report buffers above this multiple of their ideal")
    min_bytes: int = Field(
        default=1 << 20, ge=0, le=MAX_BYTES, description="and wasting at least this many bytes per chip"
    )
    verify: bool = Field(
        default=False,
        description="compile original and patched module with real XLA (slow): XLA:CPU, and XLA:TPU for a TPU "
        "chip preset when the service has libtpu",
    )


class PlanRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "hlo": _EXAMPLE_HLO, "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, "chip": "v6e",
    }]})  # fmt: skip

    hlo: str = Field(description="HLO text of one training step, as XLA or torch_xla dumps it")
    mesh: MeshSpec | None = None
    chip: str | None = Field(default=None, description="chip preset (v4, v5e, v5p, v6e, h100, h200)")
    hbm_bytes: int | None = Field(
        default=None, description="HBM per chip, instead of a preset: more than 0 bytes, at most 1 PiB"
    )
    libtpu: str | None = Field(
        default=None,
        pattern=f"^{LIBTPU_RELEASE}$",
        description="the libtpu release the step is compiled with (e.g. 0.0.52); default: the service's installed "
        "one, else the newest modelled",
    )
    manifest: Manifest | None = None
    options: PlanOptions = Field(default_factory=PlanOptions)
    # How messages name the HLO: `REQUEST_SOURCE`, or the uploaded file's name (`named`).
    _source: str = PrivateAttr(default=REQUEST_SOURCE)

    @field_validator("hbm_bytes")
    @classmethod
    def _a_chip_could_have(cls, hbm_bytes: int | None) -> int | None:
        return None if hbm_bytes is None else check_hbm_bytes(hbm_bytes)

    @model_validator(mode="after")
    def _one_capacity(self) -> PlanRequest:
        if self.chip is not None and self.hbm_bytes is not None:
            raise ValueError("give chip or hbm_bytes, not both")
        if self.chip is not None:
            chip(self.chip)  # an unknown preset is refused here, with the known ones
        return self

    def named(self, source: str) -> PlanRequest:
        """This request with its HLO named `source` in messages (`mydump.hlo:3:5: ...`)."""
        self._source = source
        return self

    @property
    def source(self) -> str:
        return self._source

    @property
    def capacity_bytes(self) -> int | None:
        return chip(self.chip).hbm_bytes if self.chip is not None else self.hbm_bytes

    def content_hash(self) -> str:
        """The stored plan's id: same HLO, same settings and the same planner, same plan."""
        settings = self.model_dump(exclude={"hlo"}, mode="json")
        settings["capacity_bytes"] = self.capacity_bytes
        settings["planner"] = planner_version()
        digest = hashlib.sha256(self.hlo.encode())
        digest.update(json.dumps(settings, sort_keys=True).encode())
        return digest.hexdigest()[:32]

    def job(self) -> dict:
        mesh = self.mesh.to_mesh() if self.mesh is not None else None
        return {
            "hlo": self.hlo,
            "mesh": None if mesh is None else {"shape": mesh.shape, "axis_names": mesh.axis_names,
                                               "device_ids": mesh.device_ids},
            "capacity_bytes": self.capacity_bytes,
            "manifest": self.manifest.model_dump(mode="json") if self.manifest is not None else None,
            "threshold": self.options.threshold,
            "min_bytes": self.options.min_bytes,
            "verify": self.options.verify,
            "chip": self.chip,
            "libtpu": self.libtpu,
            "source": self._source,
        }  # fmt: skip


class PlanRecord(BaseModel):
    id: str = Field(description="content hash of the request; GET /plans/{id} returns it again")
    created_at: float = Field(description="Unix time the plan was computed")
    cached: bool = Field(description="true when this request found a stored plan")
    plan: Plan


class SearchRow(RequestModel):
    """One candidate of a configuration search: the prediction, and the compile where one was made."""

    candidate: str = Field(description="mesh, remat, microbatches and chip, e.g. `fsdp=64,tp=4 remat=full ...`")
    capacity_bytes: int | None = None
    predicted_after_bytes: int | None = Field(default=None, description="HBM per chip with the plan applied")
    headroom_bytes: int | None = Field(default=None, description="capacity - predicted; negative: over")
    flops_per_batch: int | None = Field(default=None, description="dot FLOPs per device for the global batch")
    pinned: list[str] = Field(default_factory=list, description="parameters the plan pins")
    error: str | None = Field(default=None, description="why the candidate could not be planned")
    compiler: str | None = Field(default=None, description="the compiler that compiled it, when it was")
    compiled_bytes: int | None = None
    compile_error: str | None = None


class SearchReportBody(RequestModel):
    """A configuration search's ranking (`spmd-planner search --url`), best first."""

    builder: str = Field(description="the step builder searched, MODULE:FUNCTION")
    rows: list[SearchRow] = Field(min_length=1)

    def content_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:32]


class SearchRecord(BaseModel):
    id: str = Field(description="content hash of the report; GET /searches/{id} returns it again")
    created_at: float
    report: SearchReportBody


class SearchSpec(RequestModel):
    """What `spmd-planner search` takes, for a search job."""

    builder: str = Field(
        description="MODULE:FUNCTION of a step builder the service allows (SPMD_PLANNER_SEARCH_BUILDERS)"
    )
    devices: int = Field(ge=1, le=65536, description="chip count the meshes factor")
    axes: list[str] = Field(default=["fsdp", "tp"], min_length=1, description="mesh axis names, major to minor")
    remat: list[str] = Field(default=["none"], min_length=1, description="remat policies the builder knows")
    microbatches: list[int] = Field(default=[1], min_length=1, description="microbatch counts")
    chips: list[str] = Field(default=["v6e"], min_length=1, description="chip presets")
    top: int = Field(default=3, ge=0, le=16, description="how many of the best to compile")


class JobRequest(RequestModel):
    kind: Literal["verify", "search"] = Field(
        description="verify: plan the step, then compile it as given and with the plan's placements by real "
        "XLA (XLA:CPU, and XLA:TPU for a TPU chip when the service has libtpu); the plan is stored with the "
        "compiled numbers. search: plan every configuration of a step builder and compile the best "
        "(`spmd-planner search`); the ranking is stored as a search"
    )
    request: PlanRequest | None = Field(default=None, description="verify: what to plan, as for POST /plan")
    search: SearchSpec | None = Field(default=None, description="search: the builder and the grid")

    @model_validator(mode="after")
    def _one_payload(self) -> JobRequest:
        wanted = {"verify": "request", "search": "search"}[self.kind]
        if getattr(self, wanted) is None:
            raise ValueError(f"a {self.kind} job needs `{wanted}`")
        return self

    def payload(self) -> dict[str, Any]:
        """What the job row keeps: the part its kind reads."""
        part = self.request if self.kind == "verify" else self.search
        assert part is not None
        return part.model_dump(mode="json")
