"""Whether a plan's change set saves what it claims: the module without and with it, compiled by the compiler
the plan is for.

A finding is only as good as its fix. Wherever the plan for a compiler recommends placements, that
compiler compiles the module before and after them (XLA:CPU on virtual devices, XLA:TPU ahead of time
for the case's topology through libtpu), and the saving it measures stands beside the one predicted.
Each compile is cached by the module text it compiled, the compiler and the compiler versions, so a
sweep compiles only what changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from fidelity.references import PROJECT_ROOT, cache_dir
from planner.errors import UnfaithfulConversion
from planner.hlo.ir.module import HloModule
from planner.hlo.structure.frontend import is_torch_xla_module
from planner.hlo.text.printer import print_module
from planner.hlo.text.shardy_import import partitioner_of
from planner.plan.compilers.confirmation import confirms
from planner.plan.compilers.verify import (
    FAITHFUL,
    OutputFlags,
    Texts,
    compile_forms,
    compile_with_xla,
    output_propagation,
)
from planner.plan.diagnosis.output_parameters import outputs_and_parameters
from planner.plan.model import Plan
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.text import parse_sharding


@dataclass(frozen=True)
class PlacementCheck:
    """Bytes per chip, the compiler's and ours, before and after the plan's recommended change set.

    `xla_before` and `xla_after` compile the same representation, the module with its calls inlined
    (the one placements are written into), without and with the change set, the way `plan --verify`
    compiles them (`planner.plan.compilers.verify.compile_forms`), so their difference is the change set's alone.
    `xla_as_given` compiles the module as the front end produced it.
    """

    xla_as_given: int
    xla_before: int
    xla_after: int
    predicted_before: int
    predicted_after: int
    # The gradients XLA returns split over fewer devices than their parameters (parameter names), in the
    # module as given and with the change set in; None where the compiler did not report output shardings.
    under_sharded_before: tuple[str, ...] | None = None
    under_sharded_after: tuple[str, ...] | None = None

    @property
    def xla_saving(self) -> int:
        return self.xla_before - self.xla_after

    @property
    def predicted_saving(self) -> int:
        return self.predicted_before - self.predicted_after

    @property
    def saves(self) -> bool:
        """The compiler allocates less per chip with the change set than without it."""
        return self.xla_saving > 0

    @property
    def confirmed(self) -> bool:
        """The compiler measures the saving the plan claims (see `planner.plan.compilers.confirmation`)."""
        return confirms(self.predicted_saving, self.xla_saving)


def _versions() -> str:
    found = []
    for package in ("jaxlib", "libtpu"):
        try:
            found.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            found.append(f"{package}==absent")
    return " ".join(found)


# The code between a module's text and the compiler: a change to it changes what XLA is given, so the bytes.
COMPILE_PATH = ("planner/plan/compilers/verify.py", "planner/plan/compilers/xla_compile.py",
                "planner/plan/compilers/stablehlo.py", "planner/plan/compilers/round_trip.py",
                "planner/plan/compilers/free_outputs.py", "planner/plan/compilers/shardy_stablehlo.py",
                "planner/hlo/structure/seal.py", "planner/hlo/text/compat.py")  # fmt: skip


@functools.cache
def _compile_path() -> str:
    digest = hashlib.sha256()
    for source in COMPILE_PATH:
        digest.update((PROJECT_ROOT / source).read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Compiled:
    """What one compile is kept for: bytes per chip and the sharding XLA gave each output leaf."""

    total_bytes: int
    output_shardings: tuple[str, ...] | None


def compiled(
    text: str,
    num_devices: int,
    allow_output: OutputFlags,
    topology: str | None,
    conversion: str | None = None,
    partitioner: str = "gspmd",
) -> Compiled:
    """jaxlib's bytes per chip for one module (XLA:CPU's argument + output + temp - alias, XLA:TPU's HBM from
    its buffer assignment) and its output shardings,
    cached by content: XLA:TPU ahead of time for `topology`, XLA:CPU on `num_devices` virtual devices
    without one; `conversion` as in `compile_with_xla`; `partitioner` the one the module names, which its
    user's compile runs."""
    compiler = topology or f"cpu:{num_devices}"
    key_text = f"{compiler}\n{allow_output}\n{conversion}\n{partitioner}\n{_versions()}\n{_compile_path()}\n{text}"
    key = hashlib.sha256(key_text.encode()).hexdigest()[:20]
    path = cache_dir() / ("tpu_compiles" if topology else "cpu_compiles") / f"{key}.json"
    if path.exists():
        cached = json.loads(path.read_text())
        if "unfaithful" in cached:
            raise UnfaithfulConversion(cached["unfaithful"])
        # An entry from before output shardings were kept is compiled again rather than read as "none".
        if "output_shardings" in cached:
            return Compiled(int(cached["total_bytes"]), _tuple_or_none(cached["output_shardings"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        report = compile_with_xla(
            text, num_devices, allow_output, tpu_topology=topology, conversion=conversion, partitioner=partitioner
        )
    except UnfaithfulConversion as e:
        # A refusal is as much a property of the text as its bytes: kept, so a sweep does not convert it again.
        path.write_text(json.dumps({"compiler": compiler, "unfaithful": str(e)}))
        raise
    shardings = report.get("output_shardings")
    path.write_text(json.dumps({"compiler": compiler, "total_bytes": report["total_bytes"],
                                "output_shardings": shardings}))  # fmt: skip
    return Compiled(int(report["total_bytes"]), _tuple_or_none(shardings))


def _tuple_or_none(shardings: list[str] | None) -> tuple[str, ...] | None:
    return None if shardings is None else tuple(shardings)


def under_sharded_gradients(
    module: HloModule, allow_output: OutputFlags, output_shardings: tuple[str, ...]
) -> tuple[str, ...] | None:
    """The entry parameters whose gradient XLA returns split over fewer devices than the parameter itself.

    Outputs are paired with parameters as `planner.plan.diagnosis.output_parameters` pairs them (same dims, in order,
    each parameter once), whether or not the gradient comes out of a loop: a stacked gradient is the case that
    matters most. Only outputs propagation may shard are compared (a fixed one is the user's word). None when
    XLA's outputs are not the root tuple's elements one for one: then nothing can be said of any of them.
    """
    root = module.entry.root
    if root.opcode != "tuple":
        return ()
    if len(root.operands) != len(output_shardings):
        return None
    flags = allow_output if isinstance(allow_output, tuple) else (allow_output,) * len(root.operands)
    under: list[str] = []
    for position, _value, parameter in outputs_and_parameters(module):
        if not flags[position] or parameter.sharding is None or not parameter.sharding.is_tiled:
            continue
        dims = parameter.shape.dims  # type: ignore[union-attr]
        if _elements(parse_sharding(output_shardings[position]), dims) > _elements(parameter.sharding, dims):
            under.append(parameter.name)
    return tuple(under)


def _elements(sharding: HloSharding, dims: tuple[int, ...]) -> int:
    return math.prod(sharding.shard_shape(dims)) if sharding.is_tiled else math.prod(dims)


def check_change_set(
    original: HloModule, front: HloModule, patched: HloModule, plan: Plan, num_devices: int, topology: str | None
) -> PlacementCheck:
    """The plan's change set compiled by the compiler the plan is for (XLA:TPU for `topology`, else XLA:CPU):
    `original` as given, `front` its inlined form the placements are written into, `patched` that form with the
    plan's recommended placements."""
    allow_output = output_propagation(original)
    partitioner = partitioner_of(original)
    texts = Texts(print_module(original), print_module(front), print_module(patched))

    def compile_one(text: str, conversion: str | None) -> dict[str, object]:
        done = compiled(text, num_devices, allow_output, topology, conversion, partitioner)
        return {"total_bytes": done.total_bytes, "output_shardings": done.output_shardings}

    as_given, before, after = compile_forms(texts, compile_one, None if is_torch_xla_module(original) else FAITHFUL)

    def under(module: HloModule, report: dict) -> tuple[str, ...] | None:
        shardings = report["output_shardings"]
        return None if shardings is None else under_sharded_gradients(module, allow_output, shardings)

    return PlacementCheck(
        as_given["total_bytes"],
        before["total_bytes"],
        after["total_bytes"],
        plan.hbm.total_before,
        plan.hbm.total_after,
        under(original, as_given),
        under(patched, after),
    )
