"""`scan`: `jax.lax.scan` that pins each layer's slice of the scanned parameters as the active plan says.

The scanned `xs` is a subtree of the step's params (`params['layers']`). Its leaves are found again among the
plan's parameters by path: `path` names the subtree (`"['layers']"`); without it the one prefix under which
every leaf of `xs` is a parameter of the step, with the same stacked shape, is taken, and more than one is
refused (say which with `path`). A scan whose `xs` are not the step's parameters (microbatches, a carry
only) runs plainly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.plan.jax_terms import JaxPlan, PlanMismatch, active_plan


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    *,
    plan: JaxPlan | None = None,
    path: str | None = None,
    remat: bool | Callable[..., bool] = False,
) -> tuple[Any, Any]:
    """`jax.lax.scan(f, init, xs, ...)`, each layer slice of `xs` the plan pins constrained inside the body.

    `remat` checkpoints the body with the pins inside (True: JAX's default policy; else the policy): give it
    here rather than passing a `jax.checkpoint`ed `f`. Outside the checkpoint a pinned slice is a new value
    the backward reads, which JAX then keeps for every layer, a copy of the pinned weights.
    """
    import jax

    plan = plan if plan is not None else active_plan()
    pins = _layer_pins(plan, xs, path) if plan is not None and xs is not None else {}
    body = f
    if pins:
        assert plan is not None

        def pinned(carry: Any, layer: Any) -> tuple[Any, Any]:
            def pin(leaf_path: Any, leaf: Any) -> Any:
                spec = pins.get(jax.tree_util.keystr(leaf_path))
                return leaf if spec is None else jax.lax.with_sharding_constraint(leaf, plan.sharding(spec))

            return f(carry, jax.tree_util.tree_map_with_path(pin, layer))

        body = pinned
    if remat is not False:
        body = jax.checkpoint(body, policy=None if remat is True else remat)
    return jax.lax.scan(body, init, xs, length=length, reverse=reverse, unroll=unroll)


def _layer_pins(plan: JaxPlan, xs: Any, path: str | None) -> dict[str, Any]:
    """Leaf path within `xs` -> the layer spec the plan pins it to."""
    import jax

    leaves = [(jax.tree_util.keystr(p), tuple(leaf.shape)) for p, leaf in jax.tree_util.tree_flatten_with_path(xs)[0]]
    if not leaves:
        return {}
    prefix = path if path is not None else _prefix(plan, leaves)
    if prefix is None:
        return {}
    for rel, shape in leaves:
        if path is not None and plan.parameters and plan.parameters.get(prefix + rel) != shape:
            raise PlanMismatch(f"scan's xs{rel} {list(shape)} is not the step's parameter {prefix + rel} "
                               f"{list(plan.parameters.get(prefix + rel, ()))}")  # fmt: skip
    return {rel: plan.layer_specs[prefix + rel] for rel, _ in leaves if prefix + rel in plan.layer_specs}


def _prefix(plan: JaxPlan, leaves: list[tuple[str, tuple[int, ...]]]) -> str | None:
    first = leaves[0][0]
    candidates = {name[: len(name) - len(first)] for name in plan.parameters if name.endswith(first)}
    found = sorted(c for c in candidates if all(plan.parameters.get(c + rel) == shape for rel, shape in leaves))
    if len(found) > 1:
        raise PlanMismatch(f"scan's xs are the step's parameters under each of {found}: say which with path=")
    return found[0] if found else None
