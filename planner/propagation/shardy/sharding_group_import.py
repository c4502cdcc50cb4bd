"""Shardy's `sdy-sharding-group-import`: groups that share a value are one group.

A value may be a member of several groups (`shard_alike(x, y)` and `shard_alike(y, z)` put `y` in two),
and every member of a group takes one sharding, so all of them are one group: the import unions the
groups of each value (the smallest id leads, `unifyShardingGroups`), numbers the unions 0, 1, ... in
the order of their leaders, and keeps each value once per group (`eraseDuplicateGroups`). Example:
groups {0: [x, y], 1: [y, z], 2: [w]} become {0: [x, y, z], 1: [w]}.
"""

from __future__ import annotations

from planner.propagation.shardy.program import Program, Value


def unify_sharding_groups(program: Program) -> None:
    leader: dict[int, int] = {gid: gid for gid in program.groups}

    def find(gid: int) -> int:
        while leader[gid] != gid:
            leader[gid] = leader[leader[gid]]
            gid = leader[gid]
        return gid

    first_group: dict[int, int] = {}  # value index -> the first group it was met in
    for gid in sorted(program.groups):
        for member in program.groups[gid]:
            seen = first_group.setdefault(member.index, gid)
            a, b = find(seen), find(gid)
            if a != b:
                leader[max(a, b)] = min(a, b)
    merged: dict[int, list[Value]] = {}
    for gid in sorted(program.groups):
        members = merged.setdefault(find(gid), [])
        for member in program.groups[gid]:
            if all(m is not member for m in members):
                members.append(member)
    program.groups = {new: merged[old] for new, old in enumerate(sorted(merged))}
