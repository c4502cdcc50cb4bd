"""Whether our propagation reaches XLA's partitioned program: per-device While shapes, element by element.

The shapes a loop carries after XLA's SPMD partitioner are the memory the loop holds; when ours
equal them, a memory error lies in the memory model, not in propagation.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fidelity.matching import pair_instructions
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import Shape, TupleShape, parse_shape
from planner.plan.model import Plan
from planner.prepare import PreparedModule
from planner.propagation import PropagationResult, propagate
from planner.scanner import Cursor
from planner.sharding import HloSharding, parse_sharding


def per_device_dims(shape: Shape, sharding: HloSharding) -> list[tuple[int, ...]]:
    leaves = shape.leaves()
    elements = sharding.elements if sharding.is_tuple else (sharding,) * len(leaves)
    return [s.shard_shape(leaf.dims) for leaf, s in zip(leaves, elements)]


def partitioner_made(entry: dict[str, str]) -> bool:
    """A loop XLA's SPMD partitioner itself made (a windowed einsum's `windowed_dot_general_body_*`):
    it did not exist when propagation ran, so there is nothing of ours to compare it with."""
    return "windowed_dot_general" in entry.get("body", "")


_CLONE_SUFFIX = re.compile(r"(\.clone(\.\d+)?)+$")


def one_per_function(loops: list[Any], shapes: dict[str, Shape]) -> list[Any]:
    """`loops` with the copies `flatten-call-graph` made for a kept call's other call sites left out where
    they carry what the first copy carries.

    A callee kept as a call (XLA:TPU's large shared callees) is one computation in XLA's partitioned module
    for all its call sites that share its shardings (Shardy's `sdy-unflatten-call-graph` merges the copies
    its import made), so its loops are listed once; ours are flattened into one copy per site
    (`NAME.clone`), each propagated on its own.
    """
    seen: set[tuple[str, str, str]] = set()
    kept = []
    for loop in loops:
        key = (_CLONE_SUFFIX.sub("", loop.name), str(shapes[loop.name]), str(loop.sharding))
        if key not in seen:
            seen.add(key)
            kept.append(loop)
    return kept


def while_shape_mismatches(
    prepared: PreparedModule, xla_whiles: list[dict[str, str]], result: PropagationResult | None = None
) -> tuple[int, list[str]]:
    """Per-device While tuple shapes from the user-facing dump against XLA's partitioned ones.

    `result` is `propagate(prepared)` when the caller has it already. Returns (elements compared,
    descriptions of the ones that differ). Loops are paired by their tuple structure (arity and
    element dims).
    """
    result = result if result is not None else propagate(prepared)
    shapes = {i.name: i.shape for c in prepared.module.computations for i in c}
    xla_whiles = [w for w in xla_whiles if not partitioner_made(w)]
    ours = one_per_function([i for i in result.instructions if i.opcode == "while"], shapes)
    compared, misses = 0, []
    xla_leaves = []
    for entry in xla_whiles:
        xla_shape = parse_shape(Cursor(entry["shape"]), {})
        assert isinstance(xla_shape, TupleShape)
        xla_leaves.append([leaf.dims for leaf in xla_shape.leaves()])
    arities = Counter(len(dims) for dims in xla_leaves)
    seen_arity: Counter[int] = Counter()
    for entry, xla_dims in zip(xla_whiles, xla_leaves, strict=True):
        matches = [w for w in ours if len(shapes[w.name].leaves()) == len(xla_dims)]
        # Loops of one arity (a step's two microbatch loops) pair in the order both modules list them.
        nth = seen_arity[len(xla_dims)]
        seen_arity[len(xla_dims)] += 1
        if len(matches) != 1 and len(matches) != arities[len(xla_dims)]:
            misses.append(f"{entry['name']}: {len(matches)} loops of arity {len(xla_dims)} in our module")
            continue
        loop = matches[nth] if len(matches) > 1 else matches[0]
        # Left without a sharding, a loop is replicated, as XLA's partitioner replicates what has none (a
        # searchsorted loop in a shard_map body carries local values already).
        sharding = loop.sharding if loop.sharding is not None else HloSharding.replicate()
        for index, (got, want) in enumerate(zip(per_device_dims(shapes[loop.name], sharding), xla_dims)):
            compared += 1
            if tuple(got) != tuple(want):
                misses.append(f"{loop.name} element {index}: ours {list(got)} XLA {list(want)}")
    return compared, misses


@dataclass(frozen=True)
class ShardingAgreement:
    """Instructions whose sharding after our propagation equals the compiler's, of those compared."""

    equal: int
    compared: int

    @property
    def share(self) -> float:
        return self.equal / self.compared if self.compared else 0.0

    def text(self) -> str:
        return f"{self.share:.1%} of {self.compared}" if self.compared else "n/a"


def sharding_agreement(
    prepared: PreparedModule,
    result: PropagationResult,
    xla_shardings: dict[str, str],
    xla_module: HloModule | None = None,
) -> ShardingAgreement:
    """Our shardings against the compiler's, instruction by instruction.

    `xla_shardings` is the compiler's {name: sharding} after its propagation. Without `xla_module`
    the names are the module's own (XLA:CPU keeps them); with it (XLA:TPU's module as it entered
    propagation), instructions are paired by structure (`matching.pair_instructions`), since
    XLA:TPU's passes rename what they touch.
    """
    if xla_module is None:
        pairs = {name: name for name in xla_shardings}
    else:
        pairing = pair_instructions(prepared.module, xla_module)
        pairs = {ours: theirs for (_, ours), (_, theirs) in pairing.pairs.items()}
    equal = compared = 0
    for ours, theirs in pairs.items():
        text = xla_shardings.get(theirs)
        if text is None or ours not in result:
            continue
        compared += 1
        equal += result.sharding(ours) == parse_sharding(text)
    return ShardingAgreement(equal, compared)


def gradient_outputs_found(prepared: PreparedModule, plan: Plan) -> set[int]:
    """Output positions of the gradients the plan's findings are about: a gradient output itself, or the
    outputs a stacked or accumulated gradient's loop element reaches."""
    from planner.plan.diagnosis.scan_pairs import output_positions

    covered: set[int] = set()
    for f in plan.findings:
        if f.kind == "gradient-output":
            covered.add(f.index)
        elif f.kind in ("stacked-gradient", "accumulated-gradient"):
            covered.update(output_positions(prepared.module, prepared.loop(f.loop), f.index))
    return covered


def under_sharded_gradients(record: dict[str, Any], compiler: str, threshold: float = 1.5,
                            min_bytes: int = 1 << 20) -> set[int]:  # fmt: skip
    """Positions of the gradient outputs a compiler splits over fewer devices than their parameters.

    `record` is a JAX reference's: its outputs are named `grads[...]` beside `params[...]` with their
    shapes, partition specs and the mesh; `compiler` is "cpu" (its output shardings) or "tpu".
    """
    outputs = record["tpu"]["output_shardings"] if compiler == "tpu" else record["output_shardings"]
    mesh = dict(zip(record["mesh"]["axis_names"], record["mesh"]["shape"]))
    found = set()
    for position, (name, text) in enumerate(zip(record["outputs"], outputs)):
        parameter = record["params"].get("params" + name.removeprefix("grads")) if name.startswith("grads") else None
        if parameter is None:
            continue
        shape = tuple(parameter["shape"])
        axes = [a for spec in parameter["partition_spec"] if spec for a in ([spec] if isinstance(spec, str) else spec)]
        ideal = math.prod(shape) / math.prod(mesh[a] for a in axes)
        sharding = parse_sharding(text)
        held = math.prod(sharding.shard_shape(shape)) if sharding.is_tiled else math.prod(shape)
        element_bytes = {"float32": 4, "bfloat16": 2}.get(parameter.get("dtype", "float32"), 4)
        if held > threshold * ideal and (held - ideal) * element_bytes >= min_bytes:
            found.add(position)
    return found
