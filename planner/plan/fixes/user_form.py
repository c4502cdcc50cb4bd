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

from collections.abc import Sequence
from dataclasses import dataclass

from planner.hlo.structure.frontend import TORCH_XLA
from planner.mesh import Mesh
from planner.plan.fixes.placements import PIN_OUTPUT, PIN_PARAMETER, Placement
from planner.plan.fixes.python_names import attribute_path, gradient_in_tree, is_tree_path, value_name
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
    parameter = _torch_parameter(placement) if torch else _jax_parameter(placement, names)
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
    if torch:
        code = torch_xla_code(parameter, spec, output) if parameter is not None else None
        missing = None if code is not None else _no_torch_xla_line(parameter, spec_text)
    else:
        code, missing = _jax_line(parameter, spec_text, output), None
    return UserForm(framework, parameter, spec, spec_text, _summary(what, spec_text, output), where, code, missing)


def torch_xla_code(parameter: str, spec: Sequence[AxisSpec], output: bool) -> str | None:
    """The torch_xla line that pins `parameter` (a manifest's name: inside the scanned layer for a layer's
    weight, else relative to the model) to `spec`, one line per weight where a stacked gradient is that of
    several (`a|b`); None where a name is not a parameter's dotted name, so no line can reach it."""
    spec_text = _torch_spec(tuple(spec))
    lines = []
    for name in parameter.split("|"):
        if output:
            # A returned gradient is the model's parameter's, written by backward into its `.grad`.
            target = attribute_path("model", name)
            if target is None:
                return None
            lines.append(f"xs.mark_sharding({target}.grad, mesh, {spec_text})")
        else:
            # Inside the scanned layer: the call returns the pinned tensor, and the layer computes with it.
            target = attribute_path("layer", name)
            if target is None:
                return None
            lines.append(f"{value_name(name)} = xs.mark_sharding_with_gradients({target}, mesh, {spec_text})")
    return "\n".join(lines)


def _no_torch_xla_line(parameter: str | None, spec_text: str) -> str:
    if parameter is None:
        return ("the dump names no parameter: plan the step through scan_runtime's client (its manifest names "
                "each weight) for a line to paste")  # fmt: skip
    return (f"{parameter} is not a parameter's dotted name as the model's named_parameters() gives it, so no line "
            f"can reach it: pin that weight to {spec_text} where the model holds it")  # fmt: skip


def _summary(what: str, spec_text: str, output: bool) -> str:
    if output:
        return f"pin the gradient of {what} to {spec_text} where the step returns it"
    return f"pin {what} and its gradient to {spec_text} in the scanned layer"


def _torch_parameter(placement: Placement) -> str | None:
    """The manifest's name, the only one torch_xla's user has for it: a torch_xla dump names no parameter,
    and the name table's labels (`while.953[6], kept per layer for the backward`) name values of the dump."""
    return (placement.torch_pin.parameter or None) if placement.torch_pin is not None else None


def _jax_parameter(placement: Placement, names: list[str]) -> str | None:
    """The manifest's name when it gave one; else the module's metadata's, else the first name of a parameter
    (not of its gradient); only a path into the parameters' tree, never a label of a value of the dump."""
    if placement.torch_pin is not None and placement.torch_pin.parameter:
        name: str | None = placement.torch_pin.parameter
    elif placement.pinned is not None and placement.pinned.label is not None:
        name = placement.pinned.label
    else:
        name = names[0].removeprefix("grad of ") if names else None
    return name if name is not None and is_tree_path(name) else None


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


def _jax_line(parameter: str | None, spec_text: str, output: bool) -> str:
    value = gradient_in_tree(parameter) if output else value_name(parameter)
    return f"{value} = jax.lax.with_sharding_constraint({value}, NamedSharding(mesh, {spec_text}))"


def _axis(a: AxisSpec) -> str:
    if a is None:
        return "None"
    if isinstance(a, list | tuple):
        # A dim over several mesh axes is a tuple of them; over one, still a tuple (`('tp',)`, not `('tp')`).
        return "(" + ", ".join(repr(x) for x in a) + ("," if len(a) == 1 else "") + ")"
    return repr(a)


def _jax_spec(spec: tuple[AxisSpec, ...]) -> str:
    return f"P({', '.join(_axis(a) for a in spec)})"


def _torch_spec(spec: tuple[AxisSpec, ...]) -> str:
    inner = ", ".join(_axis(a) for a in spec)
    return f"({inner},)" if len(spec) == 1 else f"({inner})"
