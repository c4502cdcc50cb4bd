"""Reading `, key=value` lists: delimit each value, then type it.

A value is delimited as raw text first (bracket groups, strings and plain runs
with no space between them), so an attribute the planner does not model is
kept verbatim; keys with a reader in `attributes.READERS` are then typed.
"""

from __future__ import annotations

import re

from planner.hlo.ir.attributes import COMPUTATION_ATTRIBUTES, READERS, WHOLE_VALUE_READERS, ComputationRefs, Raw
from planner.hlo.ir.module import Attribute
from planner.hlo.text.parse_state import ParseState, PendingReference
from planner.scanner import skip_balanced

_ATTR_KEY = re.compile(r"([A-Za-z_][\w\-]*)\s*=")
_RAW_RUN = re.compile(r'[^\s,{}()\[\]"]+')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
# A plain run, or braces with no nested braces (quoted strings allowed inside). Each character
# can be read only one way, so the possessive quantifiers change nothing but the speed.
FLAT_VALUE = r"(?:[^\s,{}()\[\]\"]++|\{(?:[^{}\"\n]++|\"(?:[^\"\\\n]++|\\.)*+\")*+\})"
_FLAT_ATTRIBUTE = re.compile(rf"\s*,\s*([A-Za-z_][\w\-]*)=({FLAT_VALUE})(?=[\s,]|$)")
# A typed value must end at a separator; anything else right after it is junk.
_VALUE_END = re.compile(r"\s|,|/\*|//|\}|$")
_ENDS_VALUE = frozenset(" \t\n,}")


def parse_attribute_list(state: ParseState, caller: str | None = None) -> tuple[Attribute, ...]:
    """Reads `, key=value` pairs at the cursor until the next token is not a comma."""
    c = state.cursor
    text = state.text
    attributes: list[Attribute] = []
    seen: set[str] = set()
    while True:
        flat = _FLAT_ATTRIBUTE.match(text, c.pos)
        if flat is not None:
            key, key_pos = flat.group(1), flat.start(1)
            attribute = state.attribute_cache.get((key, flat.group(2)))
            if attribute is None:
                attribute = read_whole_value(key, flat.group(2))
                if attribute is None:
                    c.pos = flat.start(2)
                    attribute = parse_attribute_value(state, key)
                state.attribute_cache[(key, flat.group(2))] = attribute
            c.pos = flat.end()
        elif c.try_literal(","):
            key_pos = c.skip_space()
            key = c.match(_ATTR_KEY, "an attribute like key=value").group(1)
            attribute = parse_attribute_value(state, key)
        else:
            return tuple(attributes)
        if key in seen:
            c.fail(f"attribute '{key}' is given twice", key_pos)
        seen.add(key)
        if caller is not None:
            for callee in called_computations(attribute):
                state.references.append(PendingReference(caller, callee, key_pos))
        attributes.append(attribute)


def called_computations(attribute: Attribute) -> tuple[str, ...]:
    if attribute.key in COMPUTATION_ATTRIBUTES and isinstance(attribute.value, ComputationRefs):
        return attribute.value.names
    return ()


def read_whole_value(key: str, text: str) -> Attribute | None:
    """`key=text` for a value already delimited (followed by a separator), when its reader would
    read all of it in one step; None when it needs `parse_attribute_value`."""
    reader = READERS.get(key)
    if reader is None:
        # A plain run is kept verbatim, as `_scan_raw_value` would read it.
        return Attribute(key, Raw(text), text) if _RAW_RUN.fullmatch(text) else None
    whole = WHOLE_VALUE_READERS.get(reader)
    if whole is None:
        return None
    value = whole(text)
    return None if value is None else Attribute(key, value, text)


def parse_attribute_value(state: ParseState, key: str) -> Attribute:
    c = state.cursor
    start = c.skip_space()
    reader = READERS.get(key)
    if reader is None:
        end = _scan_raw_value(state, key)
        return Attribute(key, Raw(state.text[start:end]), state.text[start:end])
    try:
        value = reader(c)
    except ValueError as e:
        c.fail(f"bad value for {key}: {e}", start)
    if state.text[c.pos : c.pos + 1] not in _ENDS_VALUE and _VALUE_END.match(state.text, c.pos) is None:
        c.fail(f"unexpected {c.describe_next()} after the value of '{key}'")
    return Attribute(key, value, state.text[start : c.pos])


def _scan_raw_value(state: ParseState, key: str) -> int:
    """Delimits a value we do not model: atoms with no space between them."""
    c = state.cursor
    text = state.text
    start = c.pos
    while c.pos < len(text):
        ch = text[c.pos]
        if ch in "([{":
            skip_balanced(c, f"the value of '{key}'")
        elif ch == '"':
            string = _STRING.match(text, c.pos)
            if string is None:
                c.fail(f"unterminated string in the value of '{key}'")
            c.pos = string.end()
        else:
            m = _RAW_RUN.match(text, c.pos)
            if m is None:
                break
            c.pos = m.end()
    if c.pos == start:
        c.fail(f"expected a value for '{key}', found {c.describe_next()}")
    return c.pos
