"""shard_map's round-trip form back into `sdy.manual_computation`, for a compile from XLA's HLO text.

XLA's HLO text writes a `shard_map` (`sdy.manual_computation`) as three instructions:

    %l = custom_call @xla.sdy.GlobalToLocalShape(%x) {xla.sdy.in_shardings = "...", xla.sdy.manual_axes = "..."}
    %b = call @xla.sdy.manual_computation_body_N(%l) {inlineable = "false"}
    %r = custom_call @xla.sdy.LocalToGlobalShape(%b) {xla.sdy.out_shardings = "...", xla.sdy.manual_axes = "..."}

XLA's round-trip import (`xla-sdy-round-trip-shard-map-import`) rebuilds the op from them; jaxlib does not
register that pass. This module writes the same rebuild on the MLIR text: the three become

    %r = sdy.manual_computation(%x) in_shardings=[...] out_shardings=[...] manual_axes={...} (%arg0: ...) {
      <the body function's ops, its `return` an `sdy.return`>
    } : (<global types>) -> <global result types>

and the body function goes. The op is isolated from above, so the body's own value names stay as they are.
A body holding a shard_map of its own is rebuilt first. Any other arrangement of the three is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.errors import UnfaithfulConversion
from planner.hlo.text.shardy_import import GLOBAL_TO_LOCAL, LOCAL_TO_GLOBAL

_ENTER = re.compile(
    r"^(?P<indent>\s*)(?P<result>%[\w#]+)(?::\d+)? = stablehlo\.custom_call @xla\.sdy\.GlobalToLocalShape"
    r"\((?P<operands>[^)]*)\) \{(?P<attrs>.*)\} : \((?P<types>.*)\) -> .*$"
)
_BODY_CALL = re.compile(
    r"^\s*(?P<result>%[\w#]+)(?::\d+)? = (?:func\.)?call @(?P<callee>xla\.sdy\.manual_computation_body[\w.]*)"
    r"\((?P<operands>[^)]*)\)"
)
_LEAVE = re.compile(
    r"^\s*(?P<result>%[\w#]+(?::\d+)?) = stablehlo\.custom_call @xla\.sdy\.LocalToGlobalShape"
    r"\((?P<operands>[^)]*)\) \{(?P<attrs>.*)\} : \(.*\) -> (?P<types>.*)$"
)
_FUNC = re.compile(r"^\s*func\.func private @(?P<name>[\w.]+)\((?P<args>.*)\) -> .* \{$")
_PER_VALUE = re.compile(r'(?P<key>xla\.sdy\.(?:in|out)_shardings) = "#sdy\.sharding_per_value<(?P<list>\[.*?\])>"')
_VALUE = re.compile(r"%([\w$.-]+)")
_AXES = re.compile(r'xla\.sdy\.manual_axes = "#sdy<manual_axes(?P<axes>\{.*?\})>"')


@dataclass(frozen=True)
class _Function:
    args: str
    body: list[str]
    first: int  # line of the `func.func`
    last: int  # line of its closing brace


def import_shard_maps(text: str) -> str:
    """`text` (a module after `xla-sdy-round-trip-import-shardy-attrs`) with every shard_map an
    `sdy.manual_computation`; raises `UnfaithfulConversion` for a round trip it cannot read."""
    while GLOBAL_TO_LOCAL in text:
        text = _rebuild_one(text)
    if LOCAL_TO_GLOBAL in text:
        raise UnfaithfulConversion(f"a {LOCAL_TO_GLOBAL} without its {GLOBAL_TO_LOCAL}: the shard_map cannot be read")
    return text


def _rebuild_one(text: str) -> str:
    lines = text.splitlines()
    functions = _functions(lines)
    for k, line in enumerate(lines):
        enter = _ENTER.match(line)
        if enter is None:
            continue
        if k + 2 >= len(lines):
            break
        call, leave = _BODY_CALL.match(lines[k + 1]), _LEAVE.match(lines[k + 2])
        if call is None or leave is None or call["callee"] not in functions:
            break
        body = functions[call["callee"]]
        if any(GLOBAL_TO_LOCAL in b for b in body.body):
            continue  # a nested shard_map: its own body is rebuilt first
        if not _uses_only(call["operands"], enter["result"]) or not _uses_only(leave["operands"], call["result"]):
            break
        op = _manual_computation(enter, leave, body)
        kept = lines[:k] + op + lines[k + 3 :]
        # The body function is used by this shard_map alone: it goes (its lines precede or follow the call).
        shift = 0 if body.first < k else len(op) - 3
        start, end = body.first + shift, body.last + shift
        return "\n".join(kept[:start] + kept[end + 1 :]) + "\n"
    raise UnfaithfulConversion(
        "a shard_map's round trip (GlobalToLocalShape, its body call, LocalToGlobalShape) is not written as XLA "
        "writes it: it cannot be read back as an sdy.manual_computation"
    )


def _functions(lines: list[str]) -> dict[str, _Function]:
    out: dict[str, _Function] = {}
    k = 0
    while k < len(lines):
        found = _FUNC.match(lines[k])
        if found is None:
            k += 1
            continue
        indent = len(lines[k]) - len(lines[k].lstrip())
        end = k + 1
        while not (lines[end].startswith(" " * indent + "}") and len(lines[end]) - len(lines[end].lstrip()) == indent):
            end += 1
        out[found["name"]] = _Function(found["args"], lines[k + 1 : end], k, end)
        k = end + 1
    return out


def _uses_only(operands: str, result: str) -> bool:
    """Whether `operands` are exactly the results of `result` (`%3` or `%3#0, %3#1, ...`)."""
    names = [o.strip() for o in operands.split(",") if o.strip()]
    return bool(names) and all(n == result or n.startswith(result + "#") for n in names)


def _manual_computation(enter: re.Match[str], leave: re.Match[str], body: _Function) -> list[str]:
    shardings = {m["key"]: m["list"].replace("\\22", '"') for m in _PER_VALUE.finditer(enter["attrs"] + leave["attrs"])}
    axes = _AXES.search(enter["attrs"])
    if "xla.sdy.in_shardings" not in shardings or "xla.sdy.out_shardings" not in shardings or axes is None:
        raise UnfaithfulConversion("a shard_map's round trip without its in_shardings, out_shardings or manual_axes")
    manual_axes = axes["axes"].replace("\\22", '"')
    indent = enter["indent"]
    # The body's value names, renamed apart from the enclosing function's (MLIR's parser reads the op's region
    # in the function's name scope).
    prefix = f"%shard_map{_name_of(leave['result'])}_"

    def renamed(line: str) -> str:
        return _VALUE.sub(lambda m: prefix + m.group(1), line)

    header = (
        f"{indent}{leave['result']} = sdy.manual_computation({enter['operands']}) "
        f"in_shardings={shardings['xla.sdy.in_shardings']} out_shardings={shardings['xla.sdy.out_shardings']} "
        f"manual_axes={manual_axes} ({renamed(body.args)}) {{"
    )
    inner = [re.sub(r"^(\s*)return\b", r"\1sdy.return", renamed(line)) for line in body.body]
    return [header, *inner, f"{indent}}} : ({enter['types']}) -> {leave['types']}"]


def _name_of(result: str) -> str:
    """`%5:2` -> `5`: the shard_map's result, which names its body's values apart."""
    return result.lstrip("%").split(":")[0].replace("#", "_")
