"""The service's own response models (requests, plans and search reports are `planner.wire`'s)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PlanSummary(BaseModel):
    id: str
    created_at: float
    module: str
    mesh: str | None
    capacity_bytes: int | None
    total_before: int = Field(description="predicted HBM per chip before the plan, bytes")
    total_after: int
    num_findings: int
    chip: str | None = Field(default=None, description="the chip preset planned for, when one was given")
    verdict: str | None = Field(
        default=None, description="after the plan: fits, does not fit, too close to call or no capacity"
    )


class PlanPage(BaseModel):
    total: int
    limit: int
    offset: int
    items: list[PlanSummary]


class ErrorDetail(BaseModel):
    detail: str
    line: int | None = Field(default=None, description="for HLO that does not parse: the line")
    column: int | None = None


class Health(BaseModel):
    status: str = "ok"
    stored_plans: int
