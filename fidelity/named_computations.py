"""`sdy.named_computation` written as the call Shardy exports it to, for a converter that refuses the op.

jaxlib's StableHLO -> HLO converter has no export for `sdy.named_computation` ("op unsupported"), so
Shardy's lit cases that use one cannot be read as they are. Shardy's own export
(`sdy-export-named-computations`) writes a named computation as a `func.call` of a private function
whose arguments carry its `in_shardings` and whose call carries its `out_shardings`; Shardy's import
(`sdy-import-func-calls`) reads every call back as a named computation. The rewrite below writes that
form, marking the call `inlineable = "false"` so it stays a call in HLO, where the Shardy engine reads
it as a named computation (`planner.propagation.shardy.program.is_named_computation`). Example:

    %1 = sdy.named_computation<"f">(%0) out_shardings=[<@m, [{"a"}]>] (%a: tensor<8xf32> loc("l5c3")) {
      sdy.return %a : tensor<8xf32> loc("l6c5")
    } : (tensor<8xf32>) -> tensor<8xf32> loc("l4c8")

becomes `%1 = func.call @f_0(%0) {mhlo.frontend_attributes = {inlineable = "false"}, sdy.sharding =
#sdy.sharding_per_value<[<@m, [{"a"}]>]>} : (tensor<8xf32>) -> tensor<8xf32> loc("l4c8")` and
`func.func private @f_0(%a: tensor<8xf32> loc("l5c3")) -> tensor<8xf32> { return %a ... }`. Named
computations do not nest in the cases; an op that refers to a value defined outside its body cannot
occur (the op is isolated from above).
"""

from __future__ import annotations

import re

_OPEN = re.compile(
    r"^(?P<indent>\s*)(?P<results>%[\w#:]+) = sdy\.named_computation<\"(?P<name>[\w.$-]+)\">\((?P<operands>[^)]*)\)"
    r"(?: in_shardings=(?P<ins>\[.*?\]))?(?: out_shardings=(?P<outs>\[.*?\]))? \((?P<args>.*)\) \{$"
)
_CLOSE = re.compile(r"^\s*\} : (?P<type>\(.*\) -> .*?) (?P<loc>loc\(.*\))$")
_RETURN = re.compile(r"^(\s*)sdy\.return\b")


def named_computations_as_calls(module_text: str) -> str:
    """`module_text` with each `sdy.named_computation` a call of a private function of its own."""
    if "sdy.named_computation" not in module_text:
        return module_text
    lines = module_text.splitlines()
    out: list[str] = []
    functions: list[list[str]] = []
    i = 0
    while i < len(lines):
        opened = _OPEN.match(lines[i])
        if opened is None:
            out.append(lines[i])
            i += 1
            continue
        body: list[str] = []
        i += 1
        while _CLOSE.match(lines[i]) is None:
            body.append(_RETURN.sub(r"\1return", lines[i]))
            i += 1
        closed = _CLOSE.match(lines[i])
        assert closed is not None
        i += 1
        callee = f"{opened['name']}_{len(functions)}"
        attrs = ['mhlo.frontend_attributes = {inlineable = "false"}']
        if opened["outs"]:
            attrs.append(f"sdy.sharding = #sdy.sharding_per_value<{opened['outs']}>")
        out.append(f"{opened['indent']}{opened['results']} = func.call @{callee}({opened['operands']}) "
                   f"{{{', '.join(attrs)}}} : {closed['type']} {closed['loc']}")  # fmt: skip
        result_types = closed["type"].split(" -> ", 1)[1]
        arguments = _arguments(opened["args"], opened["ins"])
        functions.append([f"  func.func private @{callee}({arguments}) -> {result_types} {{", *body, "  }"])
    # The functions go at the end of the module's body: before its closing line.
    close = max(k for k, line in enumerate(out) if line.startswith("}"))
    added = [line for function in functions for line in function]
    return "\n".join(out[:close] + added + out[close:]) + "\n"


def _arguments(args: str, in_shardings: str | None) -> str:
    """The body's block arguments as function arguments, each with its `in_shardings` entry."""
    if not in_shardings:
        return args
    shardings = re.findall(r"<@[^<>]*(?:<[^<>]*>[^<>]*)*>", in_shardings[1:-1])
    pieces = re.split(r",\s*(?=%)", args)
    written = []
    for k, piece in enumerate(pieces):
        name, _, rest = piece.partition(": ")
        kind, location = (rest.split(" loc(", 1) + [""])[:2]
        sharding = f" {{sdy.sharding = #sdy.sharding{shardings[k]}}}" if k < len(shardings) else ""
        written.append(f"{name}: {kind}{sharding}" + (f" loc({location}" if location else ""))
    return ", ".join(written)


_PLAIN_CALL = re.compile(r"^(?P<head>\s*%[\w#:]+ = (?:func\.)?call @[\w.$-]+\([^)]*\)) : ")


def calls_kept(module_text: str) -> str:
    """`module_text` with each attribute-free `func.call` marked `inlineable = "false"`.

    A lit test runs Shardy's pipeline on the module as written: no XLA CallInliner runs before it, so
    every call reaches `sdy-import-func-calls` (after `sdy-flatten-call-graph` gives each call site a
    callee of its own) and is propagated as a named computation. The mark keeps the call a call in HLO,
    where the engine reads it as one.
    """
    lines = []
    for line in module_text.splitlines():
        call = _PLAIN_CALL.match(line)
        if call is not None:
            line = f'{call["head"]} {{mhlo.frontend_attributes = {{inlineable = "false"}}}} : {line[call.end() :]}'
        lines.append(line)
    return "\n".join(lines) + "\n"


_NO_MANUAL_AXES = re.compile(
    r"sdy\.manual_computation\((?P<operands>[^)]*)\) (?P<ins>in_shardings=\[.*?\]) (?P<outs>out_shardings=\[.*?\]) "
    r"manual_axes=\{\} "
)


def unmanual_computations_as_named(module_text: str) -> str:
    """`module_text` with each `sdy.manual_computation` over no manual axes written as a named computation.

    Such a body is manual over nothing: its block arguments and results are data-flow edges that start
    from its `in_shardings` and `out_shardings`, as a named computation's are. jaxlib 0.12's converter to
    HLO writes the body inline and drops both lists (no `GlobalToLocalShape` is left to carry them; jaxlib
    0.7.1's keeps the manual computation); as a named computation the lists reach HLO on the call
    (`named_computations_as_calls`).
    """
    return _NO_MANUAL_AXES.sub(r'sdy.named_computation<"manual">(\g<operands>) \g<ins> \g<outs> ', module_text)


_CALL = re.compile(r"= (?:func\.)?call @")


def calls_as_opaque_ops(module_text: str) -> str:
    """`module_text` with each `func.call` written as a custom call of the callee's name.

    A single propagation pass run without `sdy-add-func-data-flow-edges` or the import links nothing: a
    call is an op the registry gives no rule (`func::CallOp`), so its results take only what their uses
    send back, and nothing passes between the caller and the callee. A custom call of an unknown target
    is that op in HLO (the callee is left unreached, as the test does not check it).
    """
    return _CALL.sub("= stablehlo.custom_call @", module_text)
