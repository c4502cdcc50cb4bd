"""Drop-in `scan` and `scan_layers`: torch_xla's, plus the plan's pins inside the scanned body.

Without a plan (none given, none active) both are exactly torch_xla's. With
one, the function scanned over is wrapped so that each weight slice the plan
names passes through `mark_sharding_with_gradients` before the user's code
sees it: the slice is pinned to the planned partition spec, and so is its
gradient in the backward loop, which is what keeps the stacked gradient
accumulator at the weight's shard.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from weakref import WeakKeyDictionary

import torch
from functorch.compile import default_partition
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten
from torch_xla.distributed.spmd import mark_sharding_with_gradients
from torch_xla.experimental import scan as xla_scan_module

from scan_runtime.layer_plan import LayerPlan, PlanMismatch, current_plan

# The wrapped function must be the same object for the same (fn, plan): torch_xla caches traced
# scans by function, so a fresh wrapper per call would retrace every step.
_PINNED: WeakKeyDictionary[Callable[..., Any], dict[int, Callable[..., Any]]] = WeakKeyDictionary()
_ONE_LAYER: dict[tuple[int, int], Callable[..., Any]] = {}


def scan(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    partition_fn: Callable[..., Any] = default_partition,
    is_fn_pure: bool = False,
    plan: LayerPlan | None = None,
) -> tuple[Any, Any]:
    """torch_xla's `scan(fn, init, xs, partition_fn, is_fn_pure)`; `plan` (or the active one) pins slices of `xs`."""
    plan = plan if plan is not None else current_plan()
    if plan is None or not plan.pins:
        return xla_scan_module.scan(fn, init, xs, partition_fn=partition_fn, is_fn_pure=is_fn_pure)
    plan.check_parameters(_slice_shapes(xs))
    return xla_scan_module.scan(_pinned(fn, plan), init, xs, partition_fn=partition_fn, is_fn_pure=is_fn_pure)


def _named_leaves(tree: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Leaves named by their dict keys joined with dots; tuple and list positions add nothing.

    `scan_layers` scans over `(params, buffers)` dicts, so a weight is named as
    in the layer (`mlp.down.weight`).
    """
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _named_leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list | tuple):
        for value in tree:
            yield from _named_leaves(value, prefix)
    elif isinstance(tree, torch.Tensor):
        yield prefix, tree


def _slice_shapes(xs: Any) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape[1:]) for name, t in _named_leaves(xs)}


def _pin_tree(tree: Any, plan: LayerPlan, prefix: str = "") -> Any:
    if isinstance(tree, dict):
        return {k: _pin_tree(v, plan, f"{prefix}.{k}" if prefix else str(k)) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_pin_tree(v, plan, prefix) for v in tree)
    spec = plan.pins.get(prefix)
    if spec is None or not isinstance(tree, torch.Tensor):
        return tree
    if tree.dim() != len(spec):
        raise PlanMismatch(
            f"the plan pins {prefix} with partition spec {spec}, but its slice has shape {tuple(tree.shape)}"
        )
    return mark_sharding_with_gradients(tree, plan.mesh, spec)


def _pinned(fn: Callable[..., Any], plan: LayerPlan) -> Callable[..., Any]:
    by_plan = _PINNED.setdefault(fn, {})
    if id(plan) not in by_plan:

        def pinned(carry: Any, x: Any) -> Any:
            return fn(carry, _pin_tree(x, plan))

        by_plan.clear()  # one plan at a time per function; an old plan's wrapper is not kept alive
        by_plan[id(plan)] = pinned
    return by_plan[id(plan)]


def scan_layers(
    layers: Iterable[torch.nn.Module],
    input_data: Any,
    partition_fn: Callable[..., Any] = default_partition,
    is_layer_pure: bool = False,
    plan: LayerPlan | None = None,
    layer_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """torch_xla's `scan_layers`: run identical layers in sequence as one scan over their stacked weights.

    `layer_kwargs` are passed to every layer as keyword arguments, the way a model's own loop passes
    them (transformers' decoder layers take `position_embeddings=(cos, sin)`, `attention_mask`,
    `position_ids`): their floating tensors ride in the scan's carry unchanged; the rest, integer
    tensors included (torch_xla's scan differentiates every carried value), the body closes over. The
    body is then made anew on each call, so `is_layer_pure` (reuse the traced body) is refused with them.
    """
    layers = list(layers)
    if not layers:
        return input_data
    params = [dict(layer.named_parameters()) for layer in layers]
    buffers = [dict(layer.named_buffers()) for layer in layers]
    for kind, trees in (("parameters", params), ("buffers", buffers)):
        if any(tree.keys() != trees[0].keys() for tree in trees):
            raise ValueError(f"scan_layers needs layers of one structure; their {kind} differ")
    stacked = (
        tree_map(lambda *ts: torch.stack(ts, dim=0), *params) if params[0] else {},
        tree_map(lambda *ts: torch.stack(ts, dim=0), *buffers) if buffers[0] else {},
    )
    if not layer_kwargs:
        one_layer = _one_layer_fn(layers[0], partition_fn, is_layer_pure)
        final, _ = scan(one_layer, input_data, stacked, partition_fn=partition_fn, is_fn_pure=is_layer_pure, plan=plan)
        return final
    if is_layer_pure:
        raise ValueError("is_layer_pure reuses one traced body, but layer_kwargs are closed over per call")
    leaves, spec = tree_flatten(dict(layer_kwargs))
    tensors = tuple(leaf for leaf in leaves if _carried(leaf))
    with_kwargs = _with_kwargs_fn(layers[0], leaves, spec)
    (final, _), _ = scan(with_kwargs, (input_data, tensors), stacked, partition_fn=partition_fn,
                         is_fn_pure=False, plan=plan)  # fmt: skip
    return final


def _carried(leaf: Any) -> bool:
    """Floating tensors ride in the carry (torch_xla's scan differentiates every carried value)."""
    return isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex())


def _with_kwargs_fn(template: torch.nn.Module, leaves: list[Any], spec: TreeSpec) -> Callable[..., Any]:
    """`((carry, kwarg tensors), (params, buffers)) -> ((layer(carry, **kwargs), kwarg tensors), None)`.

    The keyword arguments' floating tensors go through the loop as carried values the body returns as
    it got them, so the loop takes them as inputs; the other leaves are closed over.
    """
    layer = _structure_of(template)
    slots = [i for i, leaf in enumerate(leaves) if _carried(leaf)]

    def one_layer(carry: Any, weights: tuple[dict[str, Any], dict[str, Any]]) -> tuple[Any, None]:
        hidden, tensors = carry
        filled = list(leaves)
        for slot, tensor in zip(slots, tensors):
            filled[slot] = tensor
        kwargs = tree_unflatten(filled, spec)
        merged = {**weights[0], **weights[1]}
        out = torch.func.functional_call(layer, merged, (hidden,), kwargs, strict=True)
        return (out, tensors), None

    return one_layer


def _structure_of(template: torch.nn.Module) -> torch.nn.Module:
    """A copy of `template` whose parameters and buffers are meta tensors of their shapes.

    The body calls it with every weight given (`functional_call(..., strict=True)`), so the copy's own
    weights are never read. Copying the real ones would read their device data: torch_xla then gives a
    tensor it never marked the `{replicated}` annotation of its buffer, and a graph that updates it in
    place pins it there (the first layer's norm weights and biases only, left to propagation in every
    other layer).
    """
    memo: dict[int, Any] = {}
    for tensor in (*template.parameters(), *template.buffers()):
        meta = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        memo[id(tensor)] = torch.nn.Parameter(meta, tensor.requires_grad) if isinstance(
            tensor, torch.nn.Parameter) else meta  # fmt: skip
    return copy.deepcopy(template, memo)


def _one_layer_fn(template: torch.nn.Module, partition_fn: Callable[..., Any], pure: bool) -> Callable[..., Any]:
    """`(carry, (params, buffers)) -> (layer(carry), None)` on a copy of the first layer."""
    key = (id(partition_fn), id(template))
    if pure and key in _ONE_LAYER:
        return _ONE_LAYER[key]
    layer = _structure_of(template)

    def one_layer(carry: Any, weights: tuple[dict[str, Any], dict[str, Any]]) -> tuple[Any, None]:
        merged = {**weights[0], **weights[1]}
        return torch.func.functional_call(layer, merged, carry, strict=True), None

    if pure:
        _ONE_LAYER[key] = one_layer
    return one_layer
