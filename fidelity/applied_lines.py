"""A plan's JAX lines pasted into a grid case's step, compiled by XLA, and the gradients' shardings read back.

    python -m fidelity.applied_lines < REQUEST.json > ANSWER.json

The request lists cases, each with the lines a plan gives the user (`PlacementInfo.user.code`): the lines for
the scanned layer run first thing in the layer function, on its slice of the parameters (inside the layer's
`jax.checkpoint` when the step remats, where the plan says they go); the lines for a returned gradient run
on the gradients before the step returns them. Each line is executed as written, so what is checked is the
text the user copies, not our reading of it.

The case's step is lowered from its abstract arguments and compiled by XLA:CPU twice, as generated and with
the lines in. For each gradient the answer gives XLA's sharding both times and, for each parameter a line
names, whether XLA's sharding after is JAX's own equal (`Sharding.is_equivalent_to`) of the stacked spec the
line asks for (the layer dim unsplit, then the line's spec); and XLA's bytes per device both times.

One process for every case (XLA reads its device count once, when jax is imported); the cases share a
device count, the largest mesh among them.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fidelity.cases import Case, case_named
from fidelity.memory_stats import memory_record
from fidelity.steps import abstract_args, jit_options, train_step

# `name = jax.lax.with_sharding_constraint(name, NamedSharding(mesh, P(...)))`, or `grads['k'] = ...`.
_TARGET = re.compile(r"^\s*(?P<target>[^=]+?)\s*=\s*jax\.lax\.with_sharding_constraint\(")
_KEY = re.compile(r"\[['\"]([^'\"]+)['\"]\]")
_SPEC = re.compile(r"NamedSharding\(mesh, (?P<spec>P\(.*\))\)\)\s*$")


def _namespace(mesh: Any) -> dict[str, Any]:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return {"jax": jax, "NamedSharding": NamedSharding, "P": P, "mesh": mesh}


def _layer_variable(line: str) -> str:
    m = _TARGET.match(line)
    if m is None or not m.group("target").isidentifier():
        raise ValueError(f"not a line for the scanned layer: {line!r}")
    return m.group("target")


def _gradient_key(line: str) -> str:
    m = _TARGET.match(line)
    keys = _KEY.findall(m.group("target")) if m is not None else []
    if m is None or not m.group("target").startswith("grads[") or not keys:
        raise ValueError(f"not a line for a returned gradient: {line!r}")
    return keys[-1]


@contextmanager
def _lines_in_scanned_layers(lines: list[str], mesh: Any) -> Iterator[None]:
    """While tracing, the lines run first thing in the layer function, on its slice of the parameters, as the
    user writes them: inside the layer's `jax.checkpoint` when the step remats (the function the case's stack
    checkpoints), else inside the function `lax.scan` runs over a dict holding the lines' variables."""
    import jax

    if not lines:
        yield
        return
    variables = {_layer_variable(line) for line in lines}
    plain_scan, plain_checkpoint = jax.lax.scan, jax.checkpoint

    def in_layer(f: Callable[..., Any]) -> Callable[..., Any]:
        def with_lines(carry: Any, layer: Any, *rest: Any) -> Any:
            if not isinstance(layer, dict) or not variables <= set(layer):
                return f(carry, layer, *rest)
            namespace = _namespace(mesh) | dict(layer)
            for line in lines:
                exec(line, namespace)  # the plan's own line, run as the user runs it
            return f(carry, {k: namespace[k] for k in layer}, *rest)

        with_lines.has_lines = True  # type: ignore[attr-defined]
        return with_lines

    def checkpoint(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        checkpointed = plain_checkpoint(in_layer(fun), *args, **kwargs)
        checkpointed.has_lines = True  # type: ignore[attr-defined]
        return checkpointed

    def scan(f: Callable[..., Any], init: Any, xs: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not getattr(f, "has_lines", False) and isinstance(xs, dict) and variables <= set(xs):
            f = in_layer(f)
        return plain_scan(f, init, xs, *args, **kwargs)

    jax.lax.scan, jax.checkpoint = scan, checkpoint  # type: ignore[assignment]
    try:
        yield
    finally:
        jax.lax.scan, jax.checkpoint = plain_scan, plain_checkpoint


def _with_gradient_lines(step: Callable[..., Any], lines: list[str], mesh: Any) -> Callable[..., Any]:
    if not lines:
        return step

    def with_lines(*args: Any) -> Any:
        loss, grads = step(*args)
        namespace = _namespace(mesh) | {"grads": dict(grads)}
        for line in lines:
            exec(line, namespace)  # the plan's own line, run as the user runs it
        return loss, namespace["grads"]

    return with_lines


def _stacked_spec(line: str, mesh: Any, stacked: bool) -> Any:
    """The NamedSharding the line asks for, of the whole (stacked, for a layer line) array."""
    m = _SPEC.search(line)
    if m is None:
        raise ValueError(f"no NamedSharding(mesh, P(...)) in {line!r}")
    namespace = _namespace(mesh)
    spec = eval(m.group("spec"), namespace)  # the plan's own PartitionSpec text
    return namespace["NamedSharding"](mesh, namespace["P"](None, *spec) if stacked else spec)


def _hlo_text(sharding: Any, ndim: int) -> str:
    return str(sharding._to_xla_hlo_sharding(ndim))


def _compile(case: Case, mesh: Any, args: tuple[Any, ...], layer_lines: list[str], gradient_lines: list[str]) -> Any:
    """XLA:CPU's compile of the step with the lines in."""
    import jax

    with _lines_in_scanned_layers(layer_lines, mesh):
        # Built inside: the stack is checkpointed when the step function is made.
        step = _with_gradient_lines(train_step(case, mesh), gradient_lines, mesh)
        lowered = jax.jit(step, **jit_options(case, mesh, args)).lower(*args)
    return lowered.compile()


def check_case(case: Case, lines: list[dict[str, str]]) -> dict[str, Any]:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    if case.front_end != "jax" or case.optimizer:
        raise ValueError(f"{case.name}: lines are checked on JAX gradient steps (no optimizer)")
    jax.config.update("jax_use_shardy_partitioner", case.partitioner == "shardy")
    devices = np.array(jax.devices()[: case.mesh.num_devices]).reshape(case.mesh.shape)
    mesh = Mesh(devices, case.mesh.axis_names)
    layer = [entry["code"] for entry in lines if entry["place"] == "layer"]
    gradient = [entry["code"] for entry in lines if entry["place"] == "gradient"]
    args = abstract_args(case, mesh)
    _, avals = jax.eval_shape(train_step(case, mesh), *args)
    before = _compile(case, mesh, args, [], [])
    after = _compile(case, mesh, args, layer, gradient)
    keys = sorted(avals)
    got_before = before.output_shardings[1]
    got_after = after.output_shardings[1]
    asked_in_layer = {_layer_variable(c): _stacked_spec(c, mesh, True) for c in layer}
    asked = asked_in_layer | {_gradient_key(c): _stacked_spec(c, mesh, False) for c in gradient}
    return {
        "name": case.name,
        "before": {k: _hlo_text(got_before[k], avals[k].ndim) for k in keys},
        "after": {k: _hlo_text(got_after[k], avals[k].ndim) for k in keys},
        "asked": {k: _hlo_text(s, avals[k].ndim) for k, s in sorted(asked.items())},
        "equivalent": {k: bool(got_after[k].is_equivalent_to(s, avals[k].ndim)) for k, s in sorted(asked.items())},
        # What the pinned slices of every layer hold per chip at the sharding asked: JAX keeps the pinned
        # slices for the backward when nothing recomputes them (no remat), a copy of this size at most.
        "pinned_layer_bytes": sum(
            math.prod(s.shard_shape(avals[k].shape)) * avals[k].dtype.itemsize for k, s in asked_in_layer.items()
        ),
        "total_bytes_before": memory_record(before.memory_analysis())["total_bytes"],
        "total_bytes_after": memory_record(after.memory_analysis())["total_bytes"],
    }


def main() -> int:
    request = json.load(sys.stdin)
    cases = [(case_named(entry["case"]), entry["lines"]) for entry in request["cases"]]
    if "jax" in sys.modules:
        raise RuntimeError("jax was imported before its device count was set")
    devices = max(c.mesh.num_devices for c, _ in cases)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    json.dump({"cases": [check_case(case, lines) for case, lines in cases]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
