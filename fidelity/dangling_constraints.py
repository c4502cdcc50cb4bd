"""Sharding constraints a lit test leaves unused, kept alive through the conversion to HLO.

A test may constrain a value twice and use only one of the constraints
(`%1 = sdy.sharding_constraint %0 <[{}, {"b"}]>` beside `%2 = sdy.sharding_constraint %0 <[{"a"}, {}]>`,
returning `%2`): Shardy's passes run on the MLIR module, where the dangling `%1` is still an op, so it
both keeps `sdy-apply-sharding-constraints` from applying either constraint to `%0` (they differ) and
propagates its "b" back into `%0`. jaxlib's MLIR-to-HLO conversion writes only what the function
returns, so `%1` would vanish with its effect.

Each such constraint of a function's body is returned as one more result, with no sharding of its
own: a result without a sharding takes what reaches it and sends nothing back, so the module's
propagation is unchanged, and the values the test checks keep their positions (the new results come
last). A constraint inside a region (a loop body, a manual computation) cannot be returned and is left.
In a function the module calls, a result more would no longer fit the calls: such a constraint is read by
a side-effecting custom call of no results instead, an op with no rule that the converter keeps.
"""

from __future__ import annotations

import re

_FUNC = re.compile(r"^(?P<indent>\s*)func\.func (?:\w+ )*@(?P<name>[\w.$-]+)\(.*\{$")
# The target of the op that keeps a constraint of a called function alive: no registry rule knows it.
_KEEP_TARGET = "lit.kept_constraint"
_CALLEE = re.compile(r"\bcall @(?P<name>[\w.$-]+)\(")
_CONSTRAINT = re.compile(
    r"^(?P<indent>\s*)(?P<value>%[\w]+) = sdy\.sharding_constraint .* : (?P<type>tensor<[^>]*>) loc\("
)
_RETURN = re.compile(
    r"^(?P<indent>\s*)(?:func\.)?return(?P<operands> [^:]*?)?(?: : (?P<types>.*?))? loc\((?P<loc>.*)\)$"
)
_SIGNATURE_END = re.compile(r"\)(?P<results> -> .*)? \{$")


def return_dangling_constraints(module_text: str) -> str:
    """The module with every unused top-level sharding constraint of each function returned as well."""
    lines = module_text.split("\n")
    called = set(_CALLEE.findall(module_text))
    func_line: int | None = None
    called_function = False
    body_indent = ""
    dangling: list[tuple[str, str]] = []
    for number, line in enumerate(lines):
        func = _FUNC.match(line)
        if func is not None:
            func_line, body_indent, dangling = number, func.group("indent") + "  ", []
            called_function = func.group("name") in called
            if called_function:
                func_line = None  # its calls fix its results: its constraints are kept in the body instead
            continue
        constraint = _CONSTRAINT.match(line)
        if constraint is not None and constraint.group("indent") == body_indent:
            if _used_after(lines, number, constraint.group("value")):
                continue
            if func_line is not None:
                dangling.append((constraint.group("value"), constraint.group("type")))
            elif called_function:
                lines[number] = line + "\n" + _kept(constraint)
            continue
        ret = _RETURN.match(line)
        if ret is not None and ret.group("indent") == body_indent and func_line is not None and dangling:
            lines[number] = _with_results(ret, dangling)
            lines[func_line] = _with_result_types(lines[func_line], [t for _, t in dangling])
            func_line, dangling = None, []
    return "\n".join(lines)


def _kept(constraint: re.Match[str]) -> str:
    """A side-effecting custom call of no results reading the constraint: the converter keeps both, and an
    op of an unknown target has no rule, so it sends nothing back."""
    value, kind = constraint.group("value"), constraint.group("type")
    return (f'{constraint.group("indent")}stablehlo.custom_call @{_KEEP_TARGET}({value}) {{has_side_effect = true}} : '
            f"({kind}) -> ()")  # fmt: skip


def _used_after(lines: list[str], number: int, value: str) -> bool:
    use = re.compile(re.escape(value) + r"(?![\w#])")
    return any(use.search(line) for line in lines[number + 1 :])


def _with_results(ret: re.Match[str], dangling: list[tuple[str, str]]) -> str:
    operands = [o.strip() for o in (ret.group("operands") or "").split(",") if o.strip()]
    types = _split_types(ret.group("types") or "")
    operands += [v for v, _ in dangling]
    types += [t for _, t in dangling]
    return f"{ret.group('indent')}return {', '.join(operands)} : {', '.join(types)} loc({ret.group('loc')})"


def _with_result_types(signature: str, extra: list[str]) -> str:
    end = _SIGNATURE_END.search(signature)
    if end is None:
        raise ValueError(f"cannot read the results of function signature {signature.strip()!r}")
    results = (end.group("results") or "")[len(" -> ") :]
    inner = results[1:-1] if results.startswith("(") and results.endswith(")") else results
    listed = ([inner] if inner else []) + extra
    return signature[: end.start()] + f") -> ({', '.join(listed)}) {{"


def _split_types(text: str) -> list[str]:
    """Comma-separated types, commas inside `<...>`, `(...)` and `{...}` kept."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts
