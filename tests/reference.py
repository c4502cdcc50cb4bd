"""Comparisons against XLA's recorded decisions, shared by tests and benchmarks.

Each function propagates one reference input and reports how often our
shardings (and per-device shapes) equal what XLA decided, with the misses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fidelity.agreement import per_device_dims
from planner import parse_hlo, parse_hlo_file, parse_sharding
from planner.hlo.ir.shapes import Shape
from planner.prepare import prepare
from planner.propagation import PropagationOptions, PropagationResult, propagate


@dataclass
class Agreement:
    total: int = 0
    equal: int = 0
    same_shard_shape: int = 0
    misses: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def equal_share(self) -> float:
        return self.equal / self.total if self.total else 0.0

    @property
    def shard_shape_share(self) -> float:
        return self.same_shard_shape / self.total if self.total else 0.0


def compare_shardings(result: PropagationResult, shapes: dict[str, Shape], truth: dict[str, str]) -> Agreement:
    agreement = Agreement()
    for name, text in truth.items():
        agreement.total += 1
        want = parse_sharding(text)
        got = result.sharding(name) if name in result else None
        if got == want:
            agreement.equal += 1
            agreement.same_shard_shape += 1
            continue
        agreement.misses.append((name, text, str(got)))
        shape = shapes.get(result[name].name) if name in result else None
        if got is not None and shape is not None and per_device_dims(shape, got) == per_device_dims(shape, want):
            agreement.same_shard_shape += 1
    return agreement


def torch_xla_agreement(truth_path: Path) -> Agreement:
    """Propagate NAME.pass_input.hlo and compare with xla_instruction_shardings."""
    truth = json.loads(truth_path.read_text())["xla_instruction_shardings"]
    module = parse_hlo_file(truth_path.with_name(truth_path.name.replace(".truth.json", ".pass_input.hlo")))
    result = propagate(prepare(module, pass_input=True))
    shapes = {i.name: i.shape for c in module.computations for i in c}
    shapes.update({new: shapes[old] for old, new in result.renamed.items() if old in shapes})
    return compare_shardings(result, shapes, truth)


def jax_agreement(info_path: Path) -> Agreement:
    """Propagate the JAX NAME.hlo and compare with instruction_shardings in NAME.xla.json."""
    truth = json.loads(info_path.read_text())["instruction_shardings"]
    module = parse_hlo_file(info_path.with_name(info_path.name.replace(".xla.json", ".hlo")))
    prepared = prepare(module)
    result = propagate(prepared)
    shapes = {i.name: i.shape for c in prepared.module.computations for i in c}
    return compare_shardings(result, shapes, truth)


def xla_case_results(cases: list[dict]) -> list[tuple[str, str, str, str | None]]:
    """(case, key, expected, got) for every expectation of XLA's propagation tests."""
    rows = []
    for case in cases:
        module = parse_hlo(case["hlo"])
        options = PropagationOptions(
            case["is_spmd"], tuple(case["allow_to_output"]), tuple(case["allow_to_parameters"])
        )
        result = propagate(prepare(module, options=options, pass_input=True))
        for key, want in case["expect"].items():
            if key == "@root":
                name = result.renamed.get(module.entry.root_name, module.entry.root_name)
                root_node = [i for i in result.instructions if i.computation == module.entry_name]
                got = next((i.sharding for i in root_node if i.name == name), None)
            elif key.startswith("@param:"):
                got = result.sharding(module.entry.parameters[int(key.split(":")[1])].name)
            else:
                got = result.sharding(key) if key in result else None
            rows.append((case["name"], key, want, None if got is None else got.to_text()))
    return rows


def case_met(want: str, got: str | None) -> bool:
    return got is not None and parse_sharding(want) == parse_sharding(got)
