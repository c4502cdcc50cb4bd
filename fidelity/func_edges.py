"""Function data-flow edges a lit test writes as ops of its own, read as the calls they belong to.

Shardy (jax >= 0.12) links a function to its calls by `sdy.func_data_flow_edge` ops: one on each
argument of the callee, whose sources are the operands of every call, and one on each call result,
whose source is what the callee returns. A test that runs a propagation pass on a module with the edge
ops already written (`sdy-add-func-data-flow-edges` is not in its RUN line) holds them as ops, and
jaxlib's converter has no export for them. These edges are exactly those of a named computation, the
form the engine propagates a kept call in: each edge op is taken out (its uses read its input), each
call is kept (`fidelity.named_computations.calls_kept`), and the expectation of an edge on a call's
result is what that call's results hold. Example:

    %1 = call @f(%0) : (tensor<8xf32>) -> tensor<8xf32> loc(#loc10)
    %2 = sdy.func_data_flow_edge %1 : tensor<8xf32> loc(#loc11)

leaves the call, with `%2` read as `%1` below it; the edge's location names the call's result.
"""

from __future__ import annotations

import re

_EDGE = re.compile(
    r"^\s*(?P<result>%[\w#]+) = sdy\.func_data_flow_edge (?P<input>%[\w#]+) : .* loc\((?P<loc>#loc\d+|\"l\d+c\d+\")\)$"
)
_CALL = re.compile(r"^\s*(?P<result>%[\w]+)(?::\d+)? = (?:func\.)?call @.* loc\((?P<loc>#loc\d+|\"l\d+c\d+\")\)$")
_FUNC = re.compile(r"^\s*func\.func ")
_LOC_ALIAS = re.compile(r'^(#loc\d+) = loc\("(l\d+c\d+)"\)$', re.MULTILINE)


def take_func_edges(module_text: str) -> tuple[str, dict[str, str]]:
    """The module without its function edge ops, and each call-result edge's location -> its call's."""
    if "sdy.func_data_flow_edge" not in module_text:
        return module_text, {}
    aliases = dict(_LOC_ALIAS.findall(module_text))

    def location(written: str) -> str:
        return aliases.get(written, written.strip('"'))

    kept: list[str] = []
    renamed: dict[str, str] = {}
    calls: dict[str, str] = {}
    edge_calls: dict[str, str] = {}
    for line in module_text.splitlines():
        if _FUNC.match(line):
            renamed, calls = {}, {}  # SSA names are per function
        edge = _EDGE.match(line)
        if edge is not None:
            source = renamed.get(edge["input"], edge["input"])
            renamed[edge["result"]] = source
            base = source.split("#")[0]
            if base in calls:
                edge_calls[location(edge["loc"])] = calls[base]
            continue
        for old, new in renamed.items():
            line = re.sub(re.escape(old) + r"(?![\w#])", new, line)
        call = _CALL.match(line)
        if call is not None:
            calls[call["result"]] = location(call["loc"])
        kept.append(line)
    return "\n".join(kept) + "\n", edge_calls
