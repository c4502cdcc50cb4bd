"""Stacked-gradient findings against XLA's partitioned While shapes.

The reference: every backward-loop gradient accumulator whose per-device
shape in XLA's partitioned program is larger than its parameter's shard (the
shard from the parameter's partition spec as the framework reports it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import CORPUS

from fidelity.cases import CI_SUBSET, Case
from fidelity.references import ensure_references, reference_path
from planner import parse_hlo_file, parse_sharding
from planner.hlo.ir.shapes import ArrayShape, TupleShape, parse_shape
from planner.hlo.structure.loops import invariant_elements, while_loops
from planner.plan.diagnosis.findings import buffer_findings
from planner.plan.diagnosis.scan_pairs import reaches_output, stacked_gradients
from planner.prepare import prepare
from planner.propagation import propagate
from planner.scanner import Cursor


def _param_shard_bytes(truth: dict) -> dict[tuple[int, ...], list[int]]:
    """Stacked shape -> per-device bytes of each parameter of that shape (f32)."""
    out: dict[tuple[int, ...], list[int]] = {}
    if "analysis" in truth:  # JAX: stacked parameters
        for name, shard in truth["analysis"]["param_shard_shapes"].items():
            full = tuple(truth["params"][f"params['{name}']"]["shape"])
            out.setdefault(full, []).append(4 * math.prod(shard))
        return out
    # torch_xla: per-layer Linear weights [out, in] of the Llama-like layer the step was built from.
    config = truth["config"]
    d, ff, layers = int(config["D"]), int(config["FF"]), int(config["L"])
    shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "g": (ff, d), "u": (ff, d), "d": (d, ff)}
    mesh = dict(zip(truth["mesh"]["axis_names"], truth["mesh"]["shape"]))
    for name, spec in truth["param_partition_specs"].items():
        layer, kind, _ = name.split(".")
        if layer != "0" or kind not in shapes:
            continue
        shard = [-(-n // (mesh[a] if a else 1)) for n, a in zip(shapes[kind], spec)]
        out.setdefault((layers, *shapes[kind]), []).append(4 * layers * math.prod(shard))
    return out


def _xla_whiles(truth: dict) -> list[TupleShape]:
    key = (
        "xla_post_partition_while_shapes"
        if "xla_post_partition_while_shapes" in truth
        else "post_partition_while_shapes"
    )
    return [parse_shape(Cursor(w["shape"]), {}) for w in truth[key]]  # type: ignore[misc]


SCANS = sorted(CORPUS.glob("jax/*.xla.json")) + [
    p for p in sorted(CORPUS.glob("torch_xla/*.truth.json")) if json.loads(p.read_text())["config"]["mode"] == "scan"
]
# Cases where every weight slice is pinned, or one mesh axis only: XLA keeps every gradient at its shard.
CONTROLS = ("pinned", "fixed", "fsdp8")


@pytest.mark.parametrize("truth_path", SCANS, ids=[p.name.split(".")[0] for p in SCANS])
def test_every_oversized_stacked_gradient_is_reported(truth_path: Path) -> None:
    truth = json.loads(truth_path.read_text())
    prepared = prepare(parse_hlo_file(truth_path.with_name(truth_path.name.split(".")[0] + ".hlo")))
    module, result = prepared.module, propagate(prepared)
    findings = {(f.loop, f.index): f for f in buffer_findings(module, result, 8) if f.kind == "stacked-gradient"}
    shards = _param_shard_bytes(truth)
    ours = [i for i in result.instructions if i.opcode == "while"]
    shapes = {i.name: i.shape for c in module.computations for i in c}
    expected = 0
    for xla_tuple in _xla_whiles(truth):
        loop = next(w for w in ours if len(shapes[w.name].leaves()) == len(xla_tuple.leaves()))
        for index, (global_leaf, xla_leaf) in enumerate(zip(shapes[loop.name].leaves(), xla_tuple.leaves())):
            assert isinstance(global_leaf, ArrayShape)
            candidates = shards.get(global_leaf.dims)
            if not candidates or xla_leaf.byte_size <= min(candidates):
                continue
            if not _is_gradient(module, loop.name, index):
                continue
            expected += 1
            finding = findings.get((loop.name, index))
            assert finding is not None, f"{loop.name}[{index}] {global_leaf.to_text(False)} not reported"
            assert finding.per_device_bytes == xla_leaf.byte_size
            assert finding.ideal_per_device_bytes == min(candidates)
    if any(word in truth_path.name for word in CONTROLS):
        assert expected == 0
        assert findings == {}
    else:
        assert expected >= 1
        assert len(findings) == expected  # and nothing XLA does not show as oversized


def test_plain_loop_step_has_no_stacked_gradient_findings() -> None:
    prepared = prepare(parse_hlo_file(CORPUS / "torch_xla" / "llama_loop_L4_fsdp4_tp2.hlo"))
    module = prepared.module
    findings = buffer_findings(module, propagate(prepared), 8)
    assert [f for f in findings if f.kind == "stacked-gradient"] == []


def _is_gradient(module, loop_name: str, index: int) -> bool:
    """The loop writes the element (it is not read-only) and it reaches the step's outputs."""
    loop = next(w for w in while_loops(module) if w.name == loop_name)
    body = module.computation(loop.body)
    return index not in invariant_elements(body) and reaches_output(module, loop, index)


def test_shard_group_conflict_in_llama_scan_is_reported_with_members() -> None:
    from planner.plan.diagnosis.groups import shard_group_conflicts

    prepared = prepare(parse_hlo_file(CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.hlo"))
    conflicts = shard_group_conflicts(prepared, propagate(prepared))
    assert [c.group for c in conflicts] == [1]
    (conflict,) = conflicts
    # q, k, v and o gradients with their weights: 8 members, two complete tilings that disagree.
    assert len(conflict.members) == 8
    wanted = {parse_sharding(w) for w in conflict.distinct_wanted}
    assert {parse_sharding("{devices=[2,4]0,2,4,6,1,3,5,7}"), parse_sharding("{devices=[4,2]<=[8]}")} <= wanted
    # The simulated XLA choice (it reproduces the truth file exactly): every member at the q/k/v tiling.
    assert all(parse_sharding(m.forced) == parse_sharding("{devices=[2,4]0,2,4,6,1,3,5,7}") for m in conflict.members)
    assert all(m.source is not None and "shard_alike" in m.source for m in conflict.members)


ROOT_CAUSE_CASES = [
    "torch_xla/llama_scan_L8_fsdp4_tp2",
    "torch_xla/llama_scan_L8_fsdp4_tp2_noshardas",
    "jax/jax_llama_scan_L8_fsdp4_tp2",
]


@pytest.mark.parametrize("case", ROOT_CAUSE_CASES, ids=[c.split("/")[1] for c in ROOT_CAUSE_CASES])
def test_root_cause_is_the_weight_gradient_dot_dropping_fsdp(case: str) -> None:
    from planner.mesh import Mesh
    from planner.plan.diagnosis.root_cause import root_cause

    prepared = prepare(parse_hlo_file(CORPUS / f"{case}.hlo"))
    module, result = prepared.module, propagate(prepared)
    gradients = [f for f in buffer_findings(module, result, 8) if f.kind == "stacked-gradient"]
    assert gradients
    for finding in gradients:
        cause = root_cause(module, result, finding.instruction, Mesh.parse("fsdp=4,tp=2"))
        assert cause is not None
        assert cause.opcode == "dot"
        assert (cause.tiles_before, cause.tiles_after) == (8, 2)
        assert cause.dropped_axes == ("fsdp",)
        # Both operands carry fsdp on a dim the dot contracts; the result keeps only tp.
        operands, result_label = cause.notation.split(" -> ")
        assert all("_fsdp" in side for side in operands.split(" . "))
        assert "_fsdp" not in result_label and "_tp" in result_label
        if case.startswith("jax"):
            assert cause.source is not None and "gen_jax_corpus.py:" in cause.source


PINNED_STEPS = [
    (case, target) for case in CI_SUBSET if case.pinned and case.front_end == "jax" for target in ("cpu", case.chip)
]


@pytest.mark.parametrize(("case", "target"), PINNED_STEPS, ids=[f"{c.name}-{t}" for c, t in PINNED_STEPS])
def test_on_a_pinned_step_every_stacked_gradient_holds_the_sharding_of_the_parameter_it_is_paired_with(
    case: Case, target: str
) -> None:
    """A pinned step returns each gradient in its parameter's sharding, so an accumulator paired with the
    right parameter holds that sharding. Two weights of one shape with different shardings (wq and wo) are
    paired through the outputs: on the Shardy remat step XLA's backward loop carries wo's accumulator first,
    and pairing by carried order would report both as under-sharded and pin each to the other's sharding."""
    assert not ensure_references([case])
    prepared = prepare(parse_hlo_file(reference_path(case)), target)
    result = propagate(prepared)
    gradients = stacked_gradients(prepared.module, result)
    assert gradients
    wrong = {g.key: (str(g.sharding), str(g.ideal)) for g in gradients if g.sharding != g.ideal}
    assert not wrong, wrong


def test_a_change_set_that_costs_a_little_says_how_much() -> None:
    """A cost below the totals' unit is said as its own amount, not as two equal totals."""
    from planner.plan.planner import _alternative_why

    before = 250_510_540  # 238.9 MiB
    assert _alternative_why(before, before, before + 12 * 1024, 0) == (
        "costs 12.0 KiB more per chip instead of saving memory (238.9 MiB per chip either way)"
    )
    assert _alternative_why(before, before, before + 100 * 2**20, 0) == (
        "costs 100.0 MiB more per chip instead of saving memory: 238.9 MiB -> 338.9 MiB per chip"
    )
