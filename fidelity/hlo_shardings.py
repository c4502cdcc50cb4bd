"""Each instruction's HloSharding in HLO text, keyed by the StableHLO location it came from.

jaxlib's converter writes an op's location as the instruction's `metadata={op_name="l14c8"}`, so a
sharding read here is compared with the op the lit test wrote. The entry computation's parameters
are also keyed `@param:N` and its root `@root`. The text is XLA's own print of a converted module,
read only for these three fields; the sharding stays text, as XLA prints it.
"""

from __future__ import annotations

import re

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?[\w.-]+\s*=\s*.*?\s([\w-]+)\(")
_PARAMETER = re.compile(r"\sparameter\((\d+)\)")
_SHARDING_METADATA = re.compile(r"\s+metadata=\{[^{}]*\}")
_OP_NAME = re.compile(r'metadata=\{[^}]*?op_name="([^"]*)"')


def attribute_braces(line: str, name: str) -> str | None:
    """The `{...}` value of `name=` in an instruction line, nested braces included."""
    start = line.find(f" {name}={{")
    if start < 0:
        return None
    i = line.index("{", start)
    depth = 0
    for j in range(i, len(line)):
        depth += {"{": 1, "}": -1}.get(line[j], 0)
        if depth == 0:
            return line[i : j + 1]
    return None


def hlo_shardings(text: str) -> dict[str, str]:
    """op location (first instruction that has a sharding) -> sharding; `@param:N`, `@root` of the entry."""
    out: dict[str, str] = {}
    entry = False
    for line in text.splitlines():
        if line.rstrip().endswith("{") and "=" not in line.split("{")[0]:
            entry = line.startswith("ENTRY ")
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        sharding = attribute_braces(line, "sharding")
        if sharding is None:
            continue
        # A sharding may carry metadata of its own (an unreduced axis's reduction): not the instruction's.
        op_name = _OP_NAME.search(line.replace(sharding, ""))
        sharding = _SHARDING_METADATA.sub("", sharding)
        if op_name is not None:
            out.setdefault(op_name.group(1), sharding)
        if not entry:
            continue
        parameter = _PARAMETER.search(line)
        if parameter is not None:
            out[f"@param:{parameter.group(1)}"] = sharding
        if m.group(1):
            out["@root"] = sharding
    return out
