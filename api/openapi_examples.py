"""Examples for the OpenAPI schema, cut from one real plan of the bundled dump.

`examples/plan.json` is the plan of `planner/data/llama_scan_L8_fsdp4_tp2.hlo` on the
mesh fsdp=4,tp=2 with a v6e's capacity, every list cut to its first two
items. Each documented model takes its example from the matching part of it,
so the examples are real output, not prose. Regenerate after a change to the
planner's output with `python -m api.openapi_examples`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

PLAN_EXAMPLE = Path(__file__).with_name("examples") / "plan.json"
_KEEP = 2

# Model name -> path into the example plan (keys and list indexes).
_PARTS: dict[str, tuple[str | int, ...]] = {
    "Plan": (),
    "LoopInfo": ("loops", 0),
    "HbmInfo": ("hbm",),
    "BufferInfo": ("hbm", "top_buffers_before", 0),
    "FindingInfo": ("findings", 0),
    "RootCauseInfo": ("findings", 0, "root_cause"),
    "SplitPictureInfo": ("findings", 0, "split"),
    "TensorSplitInfo": ("findings", 0, "split", "now"),
    "DimSplitInfo": ("findings", 0, "split", "now", "dims", 1),
    "UserPlacementInfo": ("placements", 0, "user"),
    "ConflictInfo": ("conflicts", 0),
    "GroupMemberInfo": ("conflicts", 0, "members", 0),
    "PlacementInfo": ("placements", 0),
    "AnnotationInfo": ("placements", 0, "annotations", 0),
    "AlternativeInfo": ("alternatives", 0),
    "TimelineSeries": ("timeline_before", 0),
    "VerdictInfo": ("verdict",),
}


def trimmed(value: Any) -> Any:
    if isinstance(value, list):
        return [trimmed(v) for v in value[:_KEEP]]
    if isinstance(value, dict):
        if "peak_index" in value:  # a timeline: its first point and its peak, still pointing at each other
            keep = sorted({0, value["peak_index"]})
            cut = {k: [value[k][i] for i in keep] for k in ("positions", "live_bytes")}
            return {**value, **cut, "peak_index": keep.index(value["peak_index"])}
        return {k: trimmed(v) for k, v in value.items()}
    return value


def make_example() -> dict[str, Any]:
    from planner.data import DEFAULT_DUMP
    from planner.hlo.text.parser import parse_hlo_file
    from planner.memory import chip
    from planner.mesh import Mesh
    from planner.passes import Planning, Preparation

    prepared = Preparation(mesh=Mesh.parse("fsdp=4,tp=2")).apply(parse_hlo_file(DEFAULT_DUMP))
    plan, _ = Planning(chip("v6e").hbm_bytes).apply(prepared)
    return trimmed(plan.model_dump(mode="json"))  # type: ignore[no-any-return]


@cache
def example_plan() -> dict[str, Any]:
    return json.loads(PLAN_EXAMPLE.read_text())  # type: ignore[no-any-return]


def example_for(model: str) -> Any | None:
    path = _PARTS.get(model)
    if path is None:
        return _OTHERS.get(model)
    value: Any = example_plan()
    for key in path:
        value = value[key]
    return value


# Models the bundled plan does not show (no manifest, no verification), and the service's own.
_OTHERS: dict[str, Any] = {
    "TorchPinInfo": {
        "parameter": "d.weight", "partition_spec": ["fsdp", "tp"], "shape": [1024, 4096],
        "call": "mark_sharding_with_gradients",
    },
    "Verification": {  # `plan --verify` on the JAX corpus case
        "xla": "jaxlib 0.7.1 (XLA GSPMD on 8 virtual CPU devices)", "frontend": "jax", "num_devices": 8,
        "before_total_bytes": 465683604, "after_total_bytes": 264357020, "predicted_saving_bytes": 216625148,
        "xla_saving_bytes": 201326584, "after_while_shapes": ["(s32[], f32[2,64,512]{2,1,0}, f32[8,2,64, ...)"],
        "stacked_gradients_at_shard": True, "gradient_mismatches": [], "seconds": 7.047,
    },
    "VerifyNotRun": {  # `plan --verify` with jaxlib 0.7.1 on a step jax 0.12 lowered (tests/fixtures/jax_0_12)
        "cause": "unreadable-module",
        "reason": "the module was written by jax 0.12 (`order=TOTAL` on lt_to.1), which the installed jaxlib 0.7.1 "
                  "cannot read; to verify it, plan it in a Python 3.12 environment with jax 0.12: pip install "
                  "'spmd-planner[jax]' 'jax==0.12.*'",
        "written_by": "jax 0.12", "jaxlib": "jaxlib 0.7.1", "install": "pip install 'spmd-planner[jax]' 'jax==0.12.*'",
    },
    "TpuVerification": {  # `plan --chip v6e --verify` on the JAX corpus case, with libtpu installed
        "xla": "jaxlib 0.7.1 (XLA:TPU, libtpu 0.0.20, GSPMD ahead of time for v6e:2x4)", "topology": "v6e:2x4",
        "before_total_bytes": 407367584, "after_total_bytes": 193293504, "xla_saving_bytes": 214074080,
    },
    # `plan --chip v6e` on a 405B-shaped Llama (L=126, fsdp=64 x tp=4, sequence 1024), which does not fit.
    "PeakHolderInfo": {
        "kind": "saved-activations", "per_device_bytes": 56583733248,
        "items": ["while.513[10] f32[126,64,128,1024,1024] -> f32[126,1,32,1024,1024] per device (15.8 GiB), "
                  "made at fidelity/models.py:157 (exp)"],
    },
    "NextStepInfo": {
        "kind": "remat",
        "summary": "remat the scanned layer (jax.checkpoint around it; torch_xla: scan_layers with a remat "
                   "partition_fn): the forward saves each layer's input (3.9 GiB per chip) instead of 52.7 GiB of "
                   "residuals, and the backward recomputes one layer's forward (+428.3 MiB)",
        "predicted_total": 13616423013, "fits": True,
        "settings": {"saved_activations_dropped_bytes": 56583733248, "saved_layer_inputs_bytes": 4227858432,
                     "recomputed_layer_bytes": 449077248},
    },
    "ManifestParameter": {"name": "0.d.weight", "shape": [1024, 4096], "partition_spec": ["fsdp", "tp"]},
    "Manifest": {
        "outputs": [None, "0.q.weight", "0.d.weight"],
        "parameters": [
            {"name": "0.q.weight", "shape": [1024, 1024], "partition_spec": ["tp", "fsdp"]},
            {"name": "0.d.weight", "shape": [1024, 4096], "partition_spec": ["fsdp", "tp"]},
        ],
    },
    "MeshSpec": {"shape": [4, 2], "axis_names": ["fsdp", "tp"], "device_ids": None},
    "PlanOptions": {"threshold": 1.5, "min_bytes": 1048576, "verify": False},
    "ErrorDetail": {
        "detail": "request:4:23: operand 'p' of 'a' is not defined earlier in computation 'e'", "line": 4, "column": 23,
    },
    "Health": {"status": "ok", "stored_plans": 12},
    # `spmd-planner search search_llama_jax:build --devices 8 --remat none,dots --top 1` (examples/), two rows.
    "SearchRow": {
        "candidate": "fsdp=2,tp=4 remat=none microbatches=1 v6e", "capacity_bytes": 34359738368,
        "predicted_after_bytes": 18894932, "headroom_bytes": 34340843436, "flops_per_batch": 26575110144,
        "pinned": ["['layers']['w_down']", "['layers']['w_gate']", "['layers']['w_up']", "['layers']['wo']"],
        "error": None, "compiler": "XLA:TPU (v6e:2x4)", "compiled_bytes": 47567296, "compile_error": None,
    },
}  # fmt: skip
_FAILED_ROW: dict[str, Any] = {
    "candidate": "fsdp=1,tp=8 remat=dots microbatches=1 v6e", "capacity_bytes": None, "predicted_after_bytes": None,
    "headroom_bytes": None, "flops_per_batch": None, "pinned": [],
    "error": "ValueError: remat='dots': this builder knows none and full (examples/search_llama_jax.py:30)",
    "compiler": None, "compiled_bytes": None, "compile_error": None,
}  # fmt: skip
_OTHERS["SearchReportBody"] = {"builder": "search_llama_jax:build", "rows": [_OTHERS["SearchRow"], _FAILED_ROW]}
_OTHERS["SearchRecord"] = {"id": "5f0c2d1e9a7b4c3d8e6f1a2b3c4d5e6f", "created_at": 1795420800.0,
                           "report": _OTHERS["SearchReportBody"]}  # fmt: skip

# A verify job of the bundled dump, as the service answered it once done (tests/test_jobs.py's run).
_JOB_ID = "00ee6260e3e34a45875e7925bd1ee9d0"
_OTHERS["SearchSpec"] = {"builder": "search_llama_jax:build", "devices": 8, "axes": ["fsdp", "tp"],
                         "remat": ["none", "full"], "microbatches": [1, 2], "chips": ["v6e"], "top": 2}  # fmt: skip
_OTHERS["JobRequest"] = {
    "kind": "verify", "search": None,
    "request": {"hlo": "HloModule m, num_partitions=8\n\nENTRY e {\n  p = f32[8,1024]{1,0} parameter(0), "
                "sharding={devices=[4,2]<=[8]}\n  ROOT n = f32[8,1024]{1,0} negate(p)\n}\n",
                "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, "chip": "v6e"},
}  # fmt: skip
_OTHERS["JobLinks"] = {"self": f"/jobs/{_JOB_ID}", "events": f"/jobs/{_JOB_ID}/events",
                       "view": f"/jobs/{_JOB_ID}/view", "plan": "/plans/c29be64f11394efc6aacaf452b97f455",
                       "search": None}  # fmt: skip
_OTHERS["JobRecord"] = {
    "id": _JOB_ID, "kind": "verify", "state": "done", "progress": 1.0, "message": "done",
    "result": {"plan_id": "c29be64f11394efc6aacaf452b97f455"}, "error": None, "verify_not_run": None, "attempt": 1,
    "created_at": 1795420800.0, "updated_at": 1795420819.4, "links": _OTHERS["JobLinks"],
}  # fmt: skip
_RUNNING_ID = "7b0acd7b32a04e47bf4a724c347b16e4"
_RUNNING_JOB = {**_OTHERS["JobRecord"], "id": _RUNNING_ID, "state": "running", "progress": 0.6,
                "message": "XLA:CPU: compiling the inlined step", "result": None,
                "links": {"self": f"/jobs/{_RUNNING_ID}", "events": f"/jobs/{_RUNNING_ID}/events",
                          "view": f"/jobs/{_RUNNING_ID}/view", "plan": None, "search": None}}  # fmt: skip
_OTHERS["JobList"] = {"items": [_RUNNING_JOB, _OTHERS["JobRecord"]]}


def service_examples() -> dict[str, Any]:
    """Examples for the response models wrapping a plan."""
    plan = example_plan()
    summary = {
        "id": "c29be64f11394efc6aacaf452b97f455", "created_at": 1795420800.0, "module": plan["module"],
        "mesh": plan["mesh"], "capacity_bytes": plan["hbm"]["capacity_bytes"],
        "total_before": plan["hbm"]["total_before"], "total_after": plan["hbm"]["total_after"],
        "num_findings": len(plan["findings"]), "chip": plan["verdict"]["chip"],
        "verdict": plan["verdict"]["call_after"],
    }  # fmt: skip
    return {
        "PlanRecord": {"id": summary["id"], "created_at": summary["created_at"], "cached": False, "plan": plan},
        "PlanSummary": summary,
        "PlanPage": {"total": 1, "limit": 20, "offset": 0, "items": [summary]},
    }


if __name__ == "__main__":
    PLAN_EXAMPLE.write_text(json.dumps(make_example(), indent=1) + "\n")
    print(f"wrote {PLAN_EXAMPLE}")
