"""Shard-group conflicts: one `shard_as` group tying tensors that want different shardings.

torch_xla 2.9's scan gives every same-shaped gradient pair in its backward the
same group id, so q/k/v/o gradients end up in one group although q/k/v are
sharded (tp, fsdp) and o (fsdp, tp). A group is in conflict when its members,
propagated without the group, are fully sharded in different ways (two
complete tilings that disagree): XLA then forces one of them on all. Members
that come out only partly sharded are what shard_as is for (a gradient pulled
to its parameter's sharding), not a conflict.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.prepare import PreparedModule
from planner.propagation import PropagationOptions, PropagationResult, propagate


@dataclass(frozen=True)
class GroupMember:
    instruction: str
    source: str | None  # the op_name / source line from metadata, when known
    wanted: str  # sharding without the group
    forced: str  # sharding with the group (XLA's)


@dataclass(frozen=True)
class ShardGroupConflict:
    group: int
    members: tuple[GroupMember, ...]

    @property
    def distinct_wanted(self) -> list[str]:
        return sorted({m.wanted for m in self.members})


def shard_group_conflicts(prepared: PreparedModule, result: PropagationResult) -> list[ShardGroupConflict]:
    """The groups of `prepared` (propagated as `result`) whose members want different complete tilings."""
    module, options = prepared.module, prepared.options
    groups: dict[int, list[str]] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            s = inst.sharding
            if s is not None and not s.is_tuple and s.shard_group is not None and s.shard_group.shard_as:
                groups.setdefault(s.shard_group.id, []).append(inst.name)
    if not groups:
        return []
    alone = propagate(
        prepared,
        PropagationOptions(options.is_spmd, options.allow_to_output, options.allow_to_parameters, shard_groups=False),
    )
    conflicts = []
    for gid, names in sorted(groups.items()):
        members = []
        fully_sharded = []
        for name in names:
            wanted, forced = alone.sharding(name), result.sharding(name)
            if wanted is None or forced is None:
                continue
            inst = module.instruction(name)
            metadata = inst.metadata
            source = None
            if metadata is not None:
                where = f"{metadata.source_file}:{metadata.source_line}" if metadata.source_file else ""
                source = " ".join(x for x in (metadata.op_name, where) if x) or None
            members.append(GroupMember(alone[name].name, source, wanted.to_short_text(), forced.to_short_text()))
            tiles = wanted.tile_assignment
            fully_sharded.append(wanted.is_tiled and not wanted.has_partial_replication and tiles is not None
                                 and wanted.num_tiles == tiles.num_devices)  # fmt: skip
        complete = {m.wanted for m, full in zip(members, fully_sharded) if full}
        if len(complete) > 1:
            conflicts.append(ShardGroupConflict(gid, tuple(members)))
    return conflicts
