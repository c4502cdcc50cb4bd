"""Data-flow edges a lit test writes as ops of its own, read as the shardings of their owners.

A test that runs a propagation pass without `sdy-add-data-flow-edges` may write the edge ops itself:
`%1 = sdy.data_flow_edge %0 sharding=<...>` says that the edge owned by `%0` (a `shard_map`'s result
or block argument) holds that sharding, which propagation starts from and updates; jaxlib's
converter has no export for the op. Each such op is taken out of the module (its uses read its input,
as `sdy-sink-data-flow-edges` leaves them), its sharding is seeded on its owner once the program is
built, and the edge's expectation is what its owner holds after propagation. Only owners of a manual
computation occur in the cases; an edge on anything else is refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.propagation.shardy.program import Program, Value
from planner.sharding.shardy import parse_sharding

_EDGE = re.compile(
    r"^\s*(?P<result>%[\w#]+) = sdy\.data_flow_edge (?P<input>%[\w#]+) sharding=(?P<sharding><.*>) : .* "
    r"loc\((?P<loc>#loc\d+|\"l\d+c\d+\")\)$"
)
_MANUAL = re.compile(r"^\s*(?P<results>%[\w#:]+) = sdy\.manual_computation\(.*\s\((?P<args>%.*)\) \{$")
_LOC_ALIAS = re.compile(r'^(#loc\d+) = loc\("(l\d+c\d+)"\)$', re.MULTILINE)
_CLOSE_LOC = re.compile(r"^\s*\} : .* loc\((?P<loc>#loc\d+|\"l\d+c\d+\")\)$")


@dataclass(frozen=True)
class WrittenEdge:
    """The sharding the edge op at `loc` holds for block argument or result `index` of the op at `owner_loc`."""

    loc: str
    owner_loc: str
    is_result: bool
    index: int
    sharding: str


def take_written_edges(module_text: str) -> tuple[str, list[WrittenEdge]]:
    """The module without its edge ops, and what each said."""
    if "sdy.data_flow_edge" not in module_text:
        return module_text, []
    aliases = dict(_LOC_ALIAS.findall(module_text))
    owners = _manual_owners(module_text.splitlines(), aliases)
    kept: list[str] = []
    renamed: dict[str, str] = {}
    edges: list[WrittenEdge] = []
    for line in module_text.splitlines():
        edge = _EDGE.match(line)
        if edge is None:
            kept.append(line)
            continue
        owner = owners.get(edge["input"])
        if owner is None:
            raise ValueError(f"a data-flow edge written on {edge['input']}, which owns no shard_map edge, is not read")
        loc, is_result, index = owner
        sharding = edge["sharding"][1:-1]
        edge_loc = aliases.get(edge["loc"], edge["loc"].strip('"'))
        edges.append(WrittenEdge(edge_loc, loc, is_result, index, f"#sdy.sharding<{sharding}>"))
        renamed[edge["result"]] = edge["input"]
    text = "\n".join(kept) + "\n"
    for result, source in renamed.items():
        text = re.sub(re.escape(result) + r"\b", source, text)
    return text, edges


def _manual_owners(lines: list[str], aliases: dict[str, str]) -> dict[str, tuple[str, bool, int]]:
    """Per SSA name: (the shard_map's location, whether a result, index) for its results and block arguments."""
    owners: dict[str, tuple[str, bool, int]] = {}
    for k, line in enumerate(lines):
        opened = _MANUAL.match(line)
        if opened is None:
            continue
        loc = _closing_loc(lines, k, aliases)
        results = opened["results"].split(":")[0]
        count = int(opened["results"].split(":")[1]) if ":" in opened["results"] else 1
        for i in range(count):
            owners[f"{results}#{i}" if count > 1 else results] = (loc, True, i)
        for i, arg in enumerate(re.findall(r"(%\w+):", opened["args"])):
            owners[arg] = (loc, False, i)
    return owners


def _closing_loc(lines: list[str], start: int, aliases: dict[str, str]) -> str:
    depth = 0
    for line in lines[start:]:
        depth += line.count("{") - line.count("}")
        closed = _CLOSE_LOC.match(line)
        if closed is not None and depth <= 0:
            loc = closed["loc"]
            return aliases.get(loc, loc.strip('"'))
    raise ValueError(f"no end found for the shard_map at line {start + 1}")


def written_edge_owners(program: Program, edges: list[WrittenEdge]) -> dict[str, Value]:
    """Per edge op location, its owner in the built program, seeded with the edge's sharding."""
    owners: dict[str, Value] = {}
    for edge in edges:
        manual = next((m for m in program.manual if m.loc == edge.owner_loc), None)
        if manual is None:
            raise ValueError(f"no shard_map at {edge.owner_loc} for the data-flow edge written on it")
        owner = (manual.results if edge.is_result else manual.arguments)[edge.index]
        owner.sharding = parse_sharding(edge.sharding)[0]
        owners[edge.loc] = owner
    return owners
