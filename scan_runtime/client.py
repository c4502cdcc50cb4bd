"""Getting a plan: from the planner service, or in-process when no URL is set.

A plan's id is the service's own recipe (`planner.wire.PlanRequest.content_hash`: HLO, mesh, capacity,
manifest, options, planner version), so the id the client prints opens the plan on the service
(`GET /plans/{id}`), and an in-process plan has the id the service would give it.

Plans are kept on disk under that id. Without a URL, the second run of the same step asks nobody
(`source: "disk cache"`). With a URL the service is asked every time (it answers a plan it holds
without recomputing it, `source: "service (stored)"`), and the disk copy is the fallback when the
service cannot be reached, with a warning that says so. A service that cannot be reached is retried
with backoff; then, with no disk copy, `strict=True` raises `PlannerUnavailable` naming the URL and the
cause, and `strict=False` warns and returns no plan, and training goes on as plain torch_xla.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.hlo.text.parser import parse_hlo
from planner.memory import chip as chip_preset
from planner.mesh import to_planner_mesh
from planner.passes import Planning, Preparation
from planner.plan.manifest import Manifest
from planner.plan.model import Plan
from planner.user_dirs import user_cache_dir
from planner.wire import MeshSpec, PlannerRefused, PlannerUnavailable, PlanOptions, PlanRecord, PlanRequest


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    plan_id: str
    # "service" (planned now), "service (stored)" (the service held it), "in-process" or "disk cache"
    source: str


def default_cache_dir() -> Path:
    return user_cache_dir("plans")


class PlannerClient:
    def __init__(
        self,
        url: str | None = None,
        mesh: Any = None,
        chip: str | None = None,
        hbm_bytes: int | None = None,
        timeout: float = 600.0,
        retries: int = 2,
        strict: bool = True,
        token: str | None = None,
        cache_dir: Path | None = None,
        verify: bool = False,
    ) -> None:
        """`mesh`: a torch_xla `Mesh` or the planner's; `chip` a preset name or `hbm_bytes` the capacity;
        `verify`: the planner compiles the step without and with the change set (the plan's `verification`)."""
        if chip is not None and hbm_bytes is not None:
            raise ValueError("give chip or hbm_bytes, not both")
        self.url = url.rstrip("/") if url else None
        self.mesh = to_planner_mesh(mesh) if mesh is not None else None
        self.chip = chip
        self.capacity_bytes = chip_preset(chip).hbm_bytes if chip is not None else hbm_bytes
        self.timeout = timeout
        self.retries = retries
        self.strict = strict
        self.token = token
        self.cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
        self.verify = verify

    def plan(self, hlo: str, manifest: Manifest | None = None) -> PlanResult | None:
        """The plan for one captured step; None only when not strict and the service is unreachable."""
        request = self.request(hlo, manifest)
        key = request.content_hash()
        cached = self.cache_dir / f"{key}.json"
        if self.url is None:
            if cached.is_file():
                return PlanResult(Plan.model_validate_json(cached.read_text()), key, "disk cache")
            plan, source = self._local(hlo, manifest), "in-process"
        else:
            try:
                plan, source = self._remote(request, key)
            except PlannerUnavailable as e:
                if cached.is_file():
                    warnings.warn(f"{e}; using the plan {key} kept on disk from an earlier run", stacklevel=2)
                    return PlanResult(Plan.model_validate_json(cached.read_text()), key, "disk cache")
                if self.strict:
                    raise
                warnings.warn(f"training on without a plan: {e}", stacklevel=2)
                return None
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".tmp")
        partial.write_text(plan.model_dump_json())
        partial.replace(cached)  # readers never see half a file
        return PlanResult(plan, key, source)

    def request(self, hlo: str, manifest: Manifest | None = None) -> PlanRequest:
        """The service's request for this step: its body, and its `content_hash()` the plan's id."""
        mesh = None
        if self.mesh is not None:
            mesh = MeshSpec(shape=list(self.mesh.shape), axis_names=list(self.mesh.axis_names),
                            device_ids=list(self.mesh.device_ids))  # fmt: skip
        hbm_bytes = self.capacity_bytes if self.chip is None else None
        return PlanRequest(hlo=hlo, mesh=mesh, chip=self.chip, hbm_bytes=hbm_bytes, manifest=manifest,
                           options=PlanOptions(verify=self.verify))  # fmt: skip

    def _local(self, hlo: str, manifest: Manifest | None) -> Plan:
        prepared = Preparation(self.chip or "cpu", self.mesh).apply(parse_hlo(hlo, source="captured step"))
        plan, _ = Planning(self.capacity_bytes, manifest=manifest, verify=self.verify).apply(prepared)
        return plan

    def _remote(self, plan_request: PlanRequest, key: str) -> tuple[Plan, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = plan_request.model_dump_json(exclude_none=True).encode()
        request = urllib.request.Request(f"{self.url}/plan", body, headers)
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(2**attempt, 10))
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    answer = PlanRecord.model_validate_json(response.read())
                if answer.id != key:
                    # Another planner version or recipe: the id printed would not open this plan.
                    raise PlannerRefused(f"the planner at {self.url} stored the plan as {answer.id!r}, "
                                         f"not {key!r}: is it another version of the planner?")  # fmt: skip
                return answer.plan, "service (stored)" if answer.cached else "service"
            except urllib.error.HTTPError as e:
                detail = _detail(e)
                if e.code < 500 or e.code == 504:  # the request itself is at fault, or too slow to retry
                    raise PlannerRefused(f"the planner at {self.url} answered {e.code}: {detail}") from None
                last = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = str(getattr(e, "reason", e))
        raise PlannerUnavailable(f"cannot reach the planner service at {self.url} "
                                 f"after {self.retries + 1} attempts: {last}")  # fmt: skip


def _detail(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read()).get("detail"))
    except (ValueError, AttributeError):
        return e.reason if isinstance(e.reason, str) else ""
