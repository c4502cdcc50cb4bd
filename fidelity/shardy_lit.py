"""Shardy's own propagation lit tests, run through our Shardy engine and scored per value.

The cases (`shared/shardy_cases/shardy_propagation_cases.json`) hold each test function as a module
(StableHLO with Shardy attributes, ops named `l<line>c<col>` after the test file), the passes its RUN
line applies, and the sharding jaxlib's real Shardy passes give each value (`expect`). A module is
read the way the planner reads any StableHLO (converted to HLO by jaxlib), propagated by
`planner.propagation.shardy`, and each expected value compared as Shardy prints it; a value we leave
without a sharding is a miss.

A data-flow edge the test wrote as its own op (`sdy.data_flow_edge %while#1`) is gone from the module
the cases hold; its expectation is keyed by the edge's location. Edges follow their loop or branch in
the test file, one per result in result order, so such a key is matched to the nearest loop or branch
above it, and to its result by its rank among that op's edge keys, counting only results whose HLO
expectation (`expect_hlo`) is sharded when those are fewer than the results.

What jaxlib's converter refuses or rewrites is first written in the form it takes (`readable_module`):
explicit reshards as constraints, manual computations over no axes as named computations (jaxlib 0.12),
function data-flow edges as the calls they link, named computations and kept calls as calls of private
functions, and unused constraints returned or kept alive. The same suites run on jax 0.7.1's cases
(`shared/shardy_cases`) and jax 0.12's (`shared/shardy_cases_jax012`), each on its own jaxlib.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from fidelity.dangling_constraints import return_dangling_constraints
from fidelity.func_edges import take_func_edges
from fidelity.named_computations import (
    calls_as_opaque_ops,
    calls_kept,
    named_computations_as_calls,
    unmanual_computations_as_named,
)
from fidelity.shardy_values import edge_shardings, expectations, instruction_id, per_value_text, sharding_text
from fidelity.written_edges import take_written_edges, written_edge_owners
from fidelity.written_reshards import reshards_as_constraints
from planner.hlo.text.jaxlib_api import jaxlib_version
from planner.hlo.text.parser import parse_hlo
from planner.hlo.text.shardy_import import module_meshes
from planner.hlo.text.stablehlo_text import read_stablehlo
from planner.propagation.shardy.apply_sharding_constraints import apply_sharding_constraints
from planner.propagation.shardy.pipeline import run_export, run_import
from planner.propagation.shardy.program import build_program
from planner.propagation.shardy.schedule import propagate
from planner.sharding.shardy import DimSharding, SdyMesh, TensorSharding, parse_mesh, parse_sharding, to_hlo_sharding

_LOC = re.compile(r"l(\d+)c(\d+)")
_SPACE = re.compile(r"\s+")
_MESH = re.compile(r"sdy\.mesh @([\w.$-]+) = (<[^\n]*>) loc")


@dataclass(frozen=True)
class Passes:
    """What a RUN line's pipeline asks of the engine."""

    propagation: str  # basic / aggressive / op-priority / user-priority
    strategy: str = "aggressive"
    conservative: bool = False
    edges_sunk: bool = False
    pipeline: bool = False  # import and export around propagation
    apply_constraints: bool = False
    dedup_functions: bool = False  # the call graph kept: one body per function, shared by its calls


def passes_of(pipeline: str) -> Passes:
    conservative = "conservative-propagation=true" in pipeline
    sunk = "sdy-sink-data-flow-edges" in pipeline
    constraints = "sdy-apply-sharding-constraints" in pipeline
    if "sdy-propagation-pipeline" in pipeline:
        dedup = "dedup-functions-fully=true" in pipeline
        return Passes("user-priority", edges_sunk=True, pipeline=True, dedup_functions=dedup)
    if "sdy-user-priority-propagate" in pipeline:
        return Passes("user-priority", conservative=conservative, edges_sunk=sunk)
    if "sdy-op-priority-propagate" in pipeline:
        return Passes("op-priority", conservative=conservative, edges_sunk=sunk)
    if "sdy-aggressive-propagate" in pipeline:
        strategy = "basic" if "propagation-strategy=basic}" in pipeline else "aggressive"
        return Passes(
            "aggressive", strategy=strategy, conservative=conservative, edges_sunk=sunk, apply_constraints=constraints
        )
    if "sdy-basic-propagate" in pipeline:
        return Passes("basic", strategy="basic", conservative=conservative, edges_sunk=sunk)
    raise ValueError(f"no propagation pass in {pipeline!r}")


@dataclass
class CaseResult:
    name: str
    source: str
    expected: dict[str, str]
    got: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    # Expected values left out of the comparison: ops the conversion to HLO wrote without their location.
    uncompared: int = 0

    # The meshes as the test declares them, and as the module read through HLO names them.
    test_meshes: dict[str, SdyMesh] = field(default_factory=dict)
    module_meshes: dict[str, SdyMesh] = field(default_factory=dict)

    def agrees(self, key: str) -> bool:
        expected, got = self.expected[key], self.got.get(key)
        if got is None:
            return False
        if _SPACE.sub("", expected) == _SPACE.sub("", got):
            return True
        return _same_placement(expected, got, self.test_meshes, self.module_meshes)

    @property
    def matched(self) -> list[str]:
        return [k for k in self.expected if self.agrees(k)]

    @property
    def missed(self) -> list[str]:
        return [k for k in self.expected if not self.agrees(k)]


def _same_placement(expected: str, got: str, test_meshes: dict[str, SdyMesh], meshes: dict[str, SdyMesh]) -> bool:
    """Equal up to the mesh's name: same devices per shard and the same open dims.

    Converting to HLO unifies meshes that only rename or split one another's axes (XLA's round trip
    keeps one mesh per device count: `@mesh_a_2_b_2 [{"a"}, {"b"}]` arrives as `@mesh_a_4
    [{"a":(1)2}, {"a":(2)2}]`), so a value is compared by what it places where, and whether each dim
    may still grow, rather than by its text.
    """
    try:
        want, have = parse_sharding(expected), parse_sharding(got)
    except ValueError:
        return False
    if len(want) != len(have):
        return False
    for w, h in zip(want, have, strict=True):
        if w.mesh == h.mesh:
            return False  # same mesh: the text must be equal
        if w.open_dims != h.open_dims or len(w.dims) != len(h.dims):
            return False
        # Unreduced axes have no GSPMD form: compared as the axes of one more dim, which places them alike.
        w, h = _unreduced_as_dim(w), _unreduced_as_dim(h)
        try:
            same = to_hlo_sharding(w, test_meshes, len(w.dims)) == to_hlo_sharding(h, meshes, len(h.dims))
        except (KeyError, ValueError):
            return False
        if not same:
            return False
    return True


def _unreduced_as_dim(sharding: TensorSharding) -> TensorSharding:
    if not sharding.unreduced:
        return sharding
    return replace(sharding, dims=(*sharding.dims, DimSharding(sharding.unreduced)), unreduced=())


def declared_meshes(module_text: str) -> dict[str, SdyMesh]:
    return {name: parse_mesh(body) for name, body in _MESH.findall(module_text)}


def load_cases(path: Path) -> list[dict]:
    cases = json.loads(path.read_text())["cases"]
    return [c for c in cases if c["kind"] != "rule" and c.get("expect")]


def _line(key: str) -> int:
    m = _LOC.match(key)
    return int(m.group(1)) if m else -1


def _edge_keys(case: dict, module_text: str, edges: dict[str, list]) -> dict[str, tuple[str, int]]:
    """Expectation keys naming edge ops absent from the module -> (loop or branch location, result)."""
    present = set(re.findall(r'loc\("(l\d+c\d+)"\)', module_text))
    missing = sorted((k for k in case["expect"] if not k.startswith("@") and k.split(":")[0] not in present), key=_line)
    owners = sorted(edges, key=_line)
    by_owner: dict[str, list[str]] = {}
    for key in missing:
        above = [o for o in owners if _line(o) < _line(key)]
        if above:
            by_owner.setdefault(above[-1], []).append(key)
    out: dict[str, tuple[str, int]] = {}
    for owner, keys in by_owner.items():
        results = list(range(len(edges[owner])))
        hlo = (case.get("expect_hlo") or {}).get(owner)
        if hlo and hlo.startswith("{{") and len(keys) < len(results):
            elements = re.findall(r"\{[^{}]*\}", hlo[1:-1])
            sharded = [i for i, e in enumerate(elements) if e != "{replicated}"]
            if len(sharded) == len(keys):
                results = sharded
        for key, result in zip(keys, results, strict=False):
            out[key] = (owner, result)
    return out


def readable_module(module_text: str, passes: Passes) -> tuple[str, dict[str, str]]:
    """The test's module in the forms jaxlib's converter takes, and each call-result function edge's
    location -> its call's (`fidelity.func_edges`).

    The test's own calls are kept (its pipeline, or its function edges, link them to their callees) or
    opaque (a single pass links nothing) before its named computations become calls of their own.
    """
    written = reshards_as_constraints(module_text)
    if jaxlib_version() >= (0, 12):
        written = unmanual_computations_as_named(written)
    written, func_edges = take_func_edges(return_dangling_constraints(written))
    written = calls_kept(written) if passes.pipeline or func_edges else calls_as_opaque_ops(written)
    return named_computations_as_calls(written), func_edges


def run_case(case: dict) -> CaseResult:
    result = CaseResult(case["name"], case["source"], dict(case["expect"]))
    try:
        passes = passes_of(case["pipeline"])
        readable, func_edges = readable_module(case["module"], passes)
        text, written_edges = take_written_edges(readable)
        module = parse_hlo(read_stablehlo(text))
        result.test_meshes = declared_meshes(case["module"])
        result.module_meshes = module_meshes(module)
        program = build_program(
            module,
            result.module_meshes,
            order_key=instruction_id,
            keep_dead=not passes.pipeline,
            dedup_functions=passes.dedup_functions,
        )
        edge_owners = written_edge_owners(program, written_edges)
        if passes.pipeline:
            run_import(program)
        elif passes.apply_constraints:
            apply_sharding_constraints(program)
        propagate(program, passes.propagation, passes.strategy, passes.conservative)
        if passes.pipeline:
            run_export(program)
        result.got = expectations(program, passes.edges_sunk, constraints_as_reshards=passes.pipeline)
        edges = edge_shardings(program)
        for key, value in edge_owners.items():
            if value.sharding is not None:
                result.got[key] = sharding_text(value.sharding)
        for key in case["expect"]:
            # A call the pipeline imported as a named computation is exported as a call again, its
            # `sdy.sharding` the named computation's out_shardings.
            exported = result.got.get(f"{key}:out_shardings")
            if passes.pipeline and key not in result.got and exported is not None:
                result.got[key] = exported
        for key, (owner, index) in _edge_keys(case, text, edges).items():
            sharding = edges[owner][index] if index < len(edges[owner]) else None
            if sharding is not None:
                result.got[key] = sharding_text(sharding)
        for key, call in func_edges.items():
            # An edge on a call's result holds what the result holds.
            held = per_value_text(program.named[call][1]) if call in program.named else None
            if held is not None:
                result.got[key] = held
    except Exception as error:  # a case that fails to run is reported, never dropped
        result.error = f"{type(error).__name__}: {error}"
    return result


def score(results: list[CaseResult]) -> dict[str, tuple[int, int]]:
    """Per test file (and overall under "*"): matched values, expected values."""
    out: dict[str, list[int]] = {}
    for r in results:
        for key in (Path(r.source).name, "*"):
            counts = out.setdefault(key, [0, 0])
            counts[0] += len(r.matched)
            counts[1] += len(r.expected)
    return {k: (v[0], v[1]) for k, v in out.items()}
