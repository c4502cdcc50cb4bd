"""A placement in the user's words: the parameter's name, a PartitionSpec over the mesh's axis names, and a
line to paste in the framework that wrote the step; the HLO edits stay with the placement as detail.

Worked example (the JAX corpus step, mesh fsdp=4,tp=2): the stacked `params['w_down']` f32[8,4096,1024]
should be `{devices=[1,2,4]<=[4,2]T(1,0)}`. One layer's slice f32[4096,1024] drops the layer dim:
`{devices=[2,4]<=[4,2]T(1,0)}`, dim 0 split 2 ways over the devices' minor mesh axis (tp) and dim 1 split 4
ways over the major one (fsdp), so its spec is `P('tp', 'fsdp')` and the line is
`w_down = jax.lax.with_sharding_constraint(w_down, NamedSharding(mesh, P('tp', 'fsdp')))` inside the scanned
function. JAX transposes a sharding constraint into the same constraint on the cotangent, so that one line
also pins the layer's gradient, as torch_xla's `mark_sharding_with_gradients` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.hlo.structure.frontend import TORCH_XLA
from planner.mesh import Mesh
from planner.plan.fixes.placements import PIN_OUTPUT, PIN_PARAMETER, Placement
from planner.sharding.partition_spec import AxisSpec, spec_from_sharding

# How the line's framework is named to the user.
JAX_FRAMEWORK = "jax"


@dataclass(frozen=True)
class UserForm:
    framework: str  # jax (also MaxText's steps) or torch_xla
    parameter: str | None  # the user's name for the parameter pinned (or whose gradient is)
    partition_spec: tuple[AxisSpec, ...] | None
    spec_text: str | None  # `P('tp', 'fsdp')` or torch_xla's tuple `('tp', 'fsdp')`
    summary: str  # the placement in a line, in the user's terms as far as they are known
    where: str  # where in the user's code the line goes
    code: str | None  # the line to paste
    missing: str | None  # why there is no line, when there is none


def user_form(placement: Placement, framework: str, mesh: Mesh | None, names: list[str]) -> UserForm | None:
    """`placement` as the user writes it in `framework` (the front end that wrote the module), over `mesh`'s
    axis names; `names` are the user's names of what it pins (the name table's, e.g. `params['wq']`)."""
    pin = placement.pinned
    if placement.kind not in (PIN_PARAMETER, PIN_OUTPUT) or pin is None:
        return None
    torch = framework == TORCH_XLA
    framework = TORCH_XLA if torch else JAX_FRAMEWORK
    parameter = _parameter_name(placement, names)
    output = placement.kind == PIN_OUTPUT
    where = _where(torch, output, parameter, pin.shape)
    what = parameter or f"the [{','.join(map(str, pin.shape))}] parameter at {pin.key or placement.fixes[0]}"
    if mesh is None:
        why = "no mesh given: pass --mesh with the mesh's axis names (major to minor) for a PartitionSpec"
        summary = _summary(what, pin.sharding.to_short_text(), output)
        return UserForm(framework, parameter, None, None, summary, where, None, why)
    try:
        spec = tuple(spec_from_sharding(pin.sharding, len(pin.shape), mesh))
    except ValueError as e:
        summary = _summary(what, pin.sharding.to_short_text(), output)
        return UserForm(framework, parameter, None, None, summary, where, None, f"{e}; the HLO edits apply it")
    spec_text = _torch_spec(spec) if torch else _jax_spec(spec)
    code = _torch_line(parameter, spec_text, output) if torch else _jax_line(parameter, spec_text, output)
    return UserForm(framework, parameter, spec, spec_text, _summary(what, spec_text, output), where, code, None)


def _summary(what: str, spec_text: str, output: bool) -> str:
    if output:
        return f"pin the gradient of {what} to {spec_text} where the step returns it"
    return f"pin {what} and its gradient to {spec_text} in the scanned layer"


def _parameter_name(placement: Placement, names: list[str]) -> str | None:
    """The manifest's name when it gave one; else the first name of a parameter (not of its gradient)."""
    if placement.torch_pin is not None and placement.torch_pin.parameter:
        return placement.torch_pin.parameter
    if placement.pinned is not None and placement.pinned.label is not None:
        return placement.pinned.label
    return names[0].removeprefix("grad of ") if names else None


def _where(torch: bool, output: bool, parameter: str | None, shape: tuple[int, ...]) -> str:
    what = parameter or f"the [{','.join(map(str, shape))}] parameter (the dump names none)"
    if output:
        if torch:
            return f"after backward, on the gradient of {what}"
        return f"on the gradient of {what} before the step returns it (or as that output's out_shardings)"
    if torch:
        return f"inside the scanned layer function, on {what}, computing with the result; the gradient follows"
    # Outside the layer's jax.checkpoint (or with no remat) the constrained slice is a new value the backward
    # reads, so JAX keeps it for every layer; inside, the backward recomputes it from the scanned slice.
    return (
        f"first thing in the layer function lax.scan runs, on this layer's slice of {what}, inside its "
        "jax.checkpoint when the step remats; the gradient follows (without remat JAX keeps every layer's "
        "pinned slice for the backward: at most one more copy of the pinned weights)"
    )


def _axis(a: AxisSpec) -> str:
    if a is None:
        return "None"
    if isinstance(a, list | tuple):
        return "(" + ", ".join(repr(x) for x in a) + ")"
    return repr(a)


def _jax_spec(spec: tuple[AxisSpec, ...]) -> str:
    return f"P({', '.join(_axis(a) for a in spec)})"


def _torch_spec(spec: tuple[AxisSpec, ...]) -> str:
    inner = ", ".join(_axis(a) for a in spec)
    return f"({inner},)" if len(spec) == 1 else f"({inner})"


_KEY = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


def _variable(parameter: str | None) -> str:
    """A Python name for the value: the last key of a JAX path (`params['layers']['wq']` -> wq), a dotted
    name with underscores (`mlp.down.weight` -> mlp_down_weight), else `w`."""
    if parameter is None:
        return "w"
    keys = _KEY.findall(parameter)
    last = keys[-1] if keys else parameter
    name = re.sub(r"\W", "_", last)
    return name if name.isidentifier() else "w"


def _gradient_expression(parameter: str | None) -> str:
    """The gradient's place in the gradients' tree: `params['w']` -> `grads['w']`, `['layers']['w']` ->
    `grads['layers']['w']`."""
    if parameter is None:
        return "grad"
    if parameter.startswith("["):
        return "grads" + parameter
    head, bracket, rest = parameter.partition("[")
    if bracket and head.isidentifier():
        return "grads[" + rest
    return f"grad_{_variable(parameter)}"


def _jax_line(parameter: str | None, spec_text: str, output: bool) -> str:
    value = _gradient_expression(parameter) if output else _variable(parameter)
    return f"{value} = jax.lax.with_sharding_constraint({value}, NamedSharding(mesh, {spec_text}))"


def _torch_line(parameter: str | None, spec_text: str, output: bool) -> str:
    # Without a name the tensor is a placeholder for the user to fill: `<the weight>`.
    if output:
        target = f"model.{parameter}.grad" if parameter else "<the weight>.grad"
        return f"xs.mark_sharding({target}, mesh, {spec_text})"
    # It returns the pinned tensor: the layer computes with the result.
    target = f"layer.{parameter}" if parameter else "<the weight>"
    return f"{_variable(parameter)} = xs.mark_sharding_with_gradients({target}, mesh, {spec_text})"
