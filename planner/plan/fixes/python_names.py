"""The user's parameter names as Python: the expressions a plan's line reads and writes.

A line the plan prints is pasted into the user's code, so every name in it must be Python that runs against
the user's model, or the plan prints no line. Worked example (a transformers Llama held as `model`):
`model.named_parameters()` names layer 3's down projection `model.layers.3.mlp.down_proj.weight`, relative to
`model`; as Python that is `model.model.layers[3].mlp.down_proj.weight`, the layer's position an index into
the `ModuleList` (a `ModuleList` or `Sequential` names its children by position and indexes by it). Inside
the scanned layer the same weight is `mlp.down_proj.weight`, which is `layer.mlp.down_proj.weight`. What the
dump calls a value (`while.953[6], kept per layer for the backward`) is a label, not such a name.

A JAX parameter is named by its path in the parameters' tree (`params['layers']['wq']`), a Python expression
of constant keys; its gradient has the same path in the gradients' tree (`grads['layers']['wq']`).
"""

from __future__ import annotations

import ast
import keyword
import re

# A child's position as `named_parameters()` writes it: `str(i)`, so no leading zeros.
_POSITION = re.compile(r"0|[1-9][0-9]*")
_KEY = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


def attribute_path(root: str, name: str) -> str | None:
    """`name`, a dotted parameter name (`named_parameters()`'s) relative to the module held as `root`, as the
    Python that reaches it: ("model", "model.layers.0.mlp.up_proj.weight") -> `model.model.layers[0].mlp.
    up_proj.weight`. None when a part is neither an attribute's name nor a position (a label, a JAX path)."""
    expression = root
    for part in name.split("."):
        if _POSITION.fullmatch(part):
            expression += f"[{part}]"
        elif _is_name(part):
            expression += f".{part}"
        else:
            return None
    return expression


def is_tree_path(name: str) -> bool:
    """Whether `name` is a path into a tree of parameters: a Python name followed by attributes and constant
    keys (`params['layers']['wq']`, `params.wq`), or the keys alone (`['layers']['wq']`)."""
    try:
        node = ast.parse("params" + name if name.startswith("[") else name, mode="eval").body
    except SyntaxError:
        return False
    while isinstance(node, ast.Subscript | ast.Attribute):
        if isinstance(node, ast.Subscript) and not (
            isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str | int)
        ):
            return False
        node = node.value
    return isinstance(node, ast.Name)


def value_name(parameter: str | None) -> str:
    """A Python name for the parameter's value: the last key of a tree path (`params['layers']['wq']` -> wq),
    a dotted name with underscores (`mlp.down.weight` -> mlp_down_weight), else `w`."""
    if parameter is None:
        return "w"
    keys = _KEY.findall(parameter)
    name = re.sub(r"\W", "_", keys[-1] if keys else parameter)
    return name if _is_name(name) else "w"


def gradient_in_tree(parameter: str | None) -> str:
    """The gradient's place in the gradients' tree: `params['w']` -> `grads['w']`, `['layers']['w']` ->
    `grads['layers']['w']`; `grad` (or `grad_<name>`) where the parameter is not a tree path."""
    if parameter is None or not is_tree_path(parameter):
        return "grad"
    if parameter.startswith("["):
        return "grads" + parameter
    head, bracket, rest = parameter.partition("[")
    if bracket and head.isidentifier():
        return "grads[" + rest
    return f"grad_{value_name(parameter)}"


def _is_name(part: str) -> bool:
    return part.isidentifier() and not keyword.iskeyword(part)
