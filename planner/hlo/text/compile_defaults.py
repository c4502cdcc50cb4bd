"""The compile options JAX passes beside a lowered module, written back into its header.

`jax.jit(f).lower(...).as_text(dialect="hlo")` prints the module without `num_partitions` and without
`allow_spmd_sharding_propagation_to_output`: jit hands both to XLA as compile options, and XLA's own
dump of the compile shows them in the header. Read without them, a step's outputs would look pinned
(propagation may not shard them) and a free gradient would be sized as replicated.

JAX's defaults, which this restores:
- propagation to an output is allowed exactly where `out_shardings` left it unspecified. The lowered
  text marks a pinned output by its root element's sharding, and an unspecified one by none when no
  output is pinned. When some are, the root needs a sharding for every element and JAX writes
  `{replicated}` for an unspecified output, which is also how an output pinned to `P()` reads. Such
  an element is read as unspecified when it has the shape of a sharded entry parameter (the gradient
  or update of a sharded weight, left free: pinning it replicated would undo the weight's sharding),
  and as pinned otherwise (a norm's gradient pinned like its replicated parameter). The plan says
  which outputs were read which way;
- propagation to a parameter is allowed where `in_shardings` left it unspecified: it has no sharding
  (a scalar has none either way);
- `num_partitions` is the mesh's device count, or, without a mesh, the device count the module's
  own shardings name.

Only a JAX module (named `jit_...` after the jitted function) gets defaults: torch_xla's captured
modules have their own (`PropagationOptions.from_module`), and a module whose header has the flags
is read as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from planner.chip_labels import index_ranges
from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import Attribute, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.text.shardy_import import SHARDY, is_func_result, leaves_dims_open, partitioner_of
from planner.mesh import Mesh

OUTPUT_FLAGS = "allow_spmd_sharding_propagation_to_output"
PARAMETER_FLAGS = "allow_spmd_sharding_propagation_to_parameters"
NUM_PARTITIONS = "num_partitions"
JAX_MODULE_PREFIXES = ("jit_", "pjit_")


def is_jax_lowering(module: HloModule) -> bool:
    """A module JAX lowered (named after the jitted function) whose header lacks the compile's flags."""
    return module.name.startswith(JAX_MODULE_PREFIXES) and module.attr(OUTPUT_FLAGS) is None


def with_jax_compile_defaults(module: HloModule, mesh: Mesh | None = None) -> tuple[HloModule, list[str]]:
    """`module` with JAX's compile options in its header where they are missing, and what was assumed."""
    if not is_jax_lowering(module):
        return module, []
    flags = output_flags_from_root(module)
    added = [Attribute(OUTPUT_FLAGS, flags, flags_text(flags))]
    if module.attr(PARAMETER_FLAGS) is None:
        # An argument whose in_sharding was left unspecified has no sharding in the lowered text; a scalar
        # has none either way (JAX leaves P() off scalars), and is replicated either way.
        to_parameters = tuple(p.sharding is None and getattr(p.shape, "rank", 0) > 0 for p in module.entry.parameters)
        added.append(Attribute(PARAMETER_FLAGS, to_parameters, flags_text(to_parameters)))
    partitions = module.attr(NUM_PARTITIONS)
    if partitions is None:
        partitions = mesh.num_devices if mesh is not None else _devices_named(module)
        if partitions is not None:
            added.append(Attribute(NUM_PARTITIONS, partitions, str(partitions)))
    free = [i for i, f in enumerate(flags) if f]
    pinned = [i for i, f in enumerate(flags) if not f]
    note = (
        f"the header has no {OUTPUT_FLAGS} (JAX's lowered text: jit passes it as a compile option); read with "
        f"JAX's defaults: propagation may shard {_outputs(free)} (out_shardings left unspecified) and keeps "
        f"{_outputs(pinned)} as pinned"
    )
    if any(a.key == NUM_PARTITIONS for a in added):
        source = "the mesh" if mesh is not None else "the module's shardings"
        note += f"; num_partitions={partitions} from {source}"
    # With a sharding on the root, every free output read {replicated} there (Shardy's calls say which).
    ambiguous = free if module.entry.root.sharding is not None and partitioner_of(module) != SHARDY else []
    if ambiguous:
        note += (
            f". {_outputs(ambiguous).capitalize()} read {{replicated}}, which JAX writes both for an unspecified "
            "output and for one pinned to P(); each has the shape of a sharded parameter, so it is read as left "
            "free. If it was pinned, plan XLA's dump of the compile (its header has the flags) instead"
        )
    return dataclasses.replace(module, attributes=module.attributes + tuple(added)), [note]


def output_flags_from_root(module: HloModule) -> tuple[bool, ...]:
    """One flag per output: whether `out_shardings` left it unspecified, as the root's sharding shows.

    Under Shardy the root's operands say it without the ambiguity of `{replicated}`: JAX returns a pinned
    output through an `xla.sdy.FuncResultSharding` call, its dims closed, and an unspecified one directly
    (or through a call whose dims are open). A scalar, replicated either way, jax 0.7.1 returns directly even
    where it is pinned: it reads as free only where nothing is pinned, as JAX's flags have it."""
    entry = module.entry
    root = entry.root
    operands = root.operands if root.opcode == "tuple" else (root.name,)
    if partitioner_of(module) == SHARDY:
        left_open = [_left_open(entry[o]) for o in operands]
        none_pinned = all(left_open)
        return tuple(
            none_pinned if getattr(entry[o].shape, "rank", 0) == 0 and not is_func_result(entry[o]) else free
            for o, free in zip(operands, left_open)
        )
    sharding = root.sharding
    if sharding is None:
        return (True,) * len(operands)
    leaves = sharding.elements if sharding.is_tuple else (sharding,)
    if len(leaves) != len(operands):
        return (True,) * len(operands)
    sharded_shapes = {
        p.shape.dims
        for p in entry.parameters
        if isinstance(p.shape, ArrayShape) and p.sharding is not None and p.sharding.is_tiled
    }
    return tuple(
        s.is_replicated and getattr(entry[o].shape, "dims", None) in sharded_shapes for o, s in zip(operands, leaves)
    )


def _left_open(inst: Instruction) -> bool:
    """Whether a Shardy module returns `inst` free to propagation: directly, or through a `FuncResultSharding`
    call that leaves a dim open or carries no sharding at all."""
    if not is_func_result(inst) or leaves_dims_open(inst):
        return True
    attrs = inst.attr("frontend_attributes")
    return inst.sharding is None and not (isinstance(attrs, FrontendAttributes) and attrs.sdy_sharding)


def _devices_named(module: HloModule) -> int | None:
    """The device count of the first tiled sharding in the module (every sharding of a module names the same)."""
    for comp in module.computations:
        for inst in comp.instructions:
            s = inst.sharding
            for leaf in s.elements if s is not None and s.is_tuple else (s,):
                if leaf is not None and leaf.tile_assignment is not None:
                    return leaf.tile_assignment.num_devices
    return None


def flags_text(flags: Iterable[bool]) -> str:
    """A flag list as the `HloModule` header writes it: `{true,false}`."""
    return "{" + ",".join("true" if f else "false" for f in flags) + "}"


def _outputs(indices: list[int]) -> str:
    """`output 3`, `outputs 0-61`, `40 outputs (0-3, 5, 7-9, …)`: a step's outputs run to hundreds."""
    if not indices:
        return "no output"
    if len(indices) == 1:
        return f"output {indices[0]}"
    ranges = index_ranges(indices, max_ranges=4)
    return f"{len(indices)} outputs ({ranges})" if "…" in ranges else f"outputs {ranges}"
