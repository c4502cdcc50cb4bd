"""User names for HLO locations: `grad of params['wq']` instead of `while.74[9]`.

Expectations come from the reference files, not from the names module: JAX's
`.xla.json` lists which entry output is whose gradient (`grads['wq']`) and
each gradient's shard shape; torch_xla's `.truth.json` lists the model's
parameter names with the sharding XLA gave each parameter and its gradient.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path

import pytest
from conftest import CORPUS

from planner import parse_hlo_file, parse_sharding
from planner.data import DEFAULT_DUMP
from planner.hlo.ir.debug_info import short_op_name
from planner.hlo.ir.module import HloModule
from planner.hlo.structure.inline import inline_calls
from planner.hlo.structure.loops import while_loops
from planner.mesh import Mesh
from planner.plan.diagnosis.scan_pairs import layer_sharding, output_positions, stacked_gradients
from planner.plan.fixes.names import name_table, without_layer
from planner.plan.manifest import Manifest, ManifestParameter
from planner.plan.model import Plan
from planner.plan.planner import make_plan
from planner.prepare import prepare
from planner.propagation import propagate

JAX_DUMP = CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo"
BUNDLED_TRUTH = CORPUS / "torch_xla" / f"{DEFAULT_DUMP.stem}.truth.json"
SCAN_TRUTHS = [
    p for p in sorted(CORPUS.glob("torch_xla/*.truth.json")) if json.loads(p.read_text())["config"]["mode"] == "scan"
]


def _truth(path: Path) -> dict:
    return json.loads(path.read_text())


def _mesh(truth: dict) -> Mesh:
    m = truth["mesh"]
    return Mesh(tuple(m["shape"]), tuple(m["axis_names"]), tuple(m["device_ids"]))


@cache
def _inlined(path: Path) -> HloModule:
    return inline_calls(parse_hlo_file(path)).module


@pytest.mark.parametrize(
    "op_name,short",
    [
        ("params['wq']", "params['wq']"),
        ("params[\\'wq\\']", "params['wq']"),
        ("jit(train_step)/transpose(jvp())/while/body/jit(silu)", "silu"),
        ("jit(train_step)/jvp()/while/body/closed_call", None),
        ("jit(train_step)/jvp()/while/body/bhqk,bkhd->bqhd/dot_general", "bhqk,bkhd->bqhd/dot_general"),
        ("jit(flat_call)/shard_alike", "shard_alike"),
        ("jit(f)/params['a/b']", "params['a/b']"),
        ("", None),
    ],
    ids=[
        "jax_param",
        "escaped_quotes",
        "nested_jit",
        "only_wrappers",
        "einsum",
        "torch_xla_shard_as",
        "slash",
        "empty",
    ],
)
def test_short_op_name_table(op_name: str, short: str | None) -> None:
    assert short_op_name(op_name) == short


@pytest.mark.parametrize(
    "name,split",
    [
        ("3.d.weight", ("d.weight", 3)),
        ("layers.12.mlp.down.weight", ("layers.mlp.down.weight", 12)),
        ("params['wq']", None),
        ("norm.weight", None),
    ],
    ids=["torch_index_first", "torch_layers_prefix", "jax_param", "outside_the_stack"],
)
def test_without_layer_table(name: str, split: tuple[str, int] | None) -> None:
    assert without_layer(name) == split


@pytest.mark.parametrize("truth_path", SCAN_TRUTHS, ids=[p.name.split(".")[0] for p in SCAN_TRUTHS])
def test_torch_xla_entry_parameters_get_the_model_names(truth_path: Path) -> None:
    """Every model parameter names one entry parameter, which carries the sharding XLA gave that parameter."""
    truth = _truth(truth_path)
    module = _inlined(CORPUS / "torch_xla" / truth["hlo"])
    table = name_table(module, parameter_names=truth["parameter_names"])
    by_name = {name: number for number, name in table.parameters.items()}
    assert sorted(by_name) == sorted(truth["parameter_names"])
    params = {p.parameter_number: p for p in module.entry.parameters}
    for name, number in by_name.items():
        assert params[number].sharding == parse_sharding(truth["xla_param_shardings"][name]), name


def test_torch_xla_names_refused_when_the_model_does_not_match() -> None:
    truth = _truth(BUNDLED_TRUTH)
    module = _inlined(DEFAULT_DUMP)
    one_layer_short = [n for n in truth["parameter_names"] if not n.startswith("7.")]
    assert name_table(module, parameter_names=one_layer_short).parameters == {}
    manifest = _manifest(truth, module)
    wrong = manifest.model_copy(deep=True)
    wrong.parameters[0].shape = [7]
    with pytest.raises(ValueError, match=rf"parameter '{wrong.parameters[0].name}' has shape=\[7\], but the entry"):
        name_table(module, wrong)


def _manifest(truth: dict, module: HloModule) -> Manifest:
    """A manifest carrying only the model's names and specs: no output is said to be anyone's gradient."""
    d, ff = int(truth["config"]["D"]), int(truth["config"]["FF"])
    shapes = {"q": [d, d], "k": [d, d], "v": [d, d], "o": [d, d], "g": [ff, d], "u": [ff, d], "d": [d, ff], "n1": [d],
              "n2": [d]}  # fmt: skip
    parameters = []
    for name in truth["parameter_names"]:
        shape = shapes[name.split(".")[1]]
        spec = truth["param_partition_specs"].get(name, [None] * len(shape))
        parameters.append(ManifestParameter(name=name, shape=shape, partition_spec=spec))
    return Manifest(outputs=[None] * len(module.entry.root.operands), parameters=parameters)


@cache
def _torch_xla_plan(with_names: bool) -> Plan:
    truth = _truth(BUNDLED_TRUTH)
    manifest = _manifest(truth, _inlined(DEFAULT_DUMP)) if with_names else None
    plan, _ = make_plan(prepare(parse_hlo_file(DEFAULT_DUMP), mesh=_mesh(truth)), manifest=manifest)
    return plan


def _truth_names(truth: dict, shape: str, current: str) -> set[str]:
    """`{grad of d.weight}`: the parameters (across layers) whose gradient XLA sharded like one layer of this one."""
    rank = len(re.findall(r"\d+", shape.split("[", 1)[1]))
    layer = layer_sharding(parse_sharding(current), rank - 1)
    return {
        f"grad of {name.split('.', 1)[1]}"
        for name in truth["parameter_names"]
        if parse_sharding(truth["gradient_shardings"][name]) == layer
    }


def test_torch_xla_stacked_gradient_findings_named_from_a_manifest() -> None:
    truth = _truth(BUNDLED_TRUTH)
    plan = _torch_xla_plan(with_names=True)
    gradients = [f for f in plan.findings if f.kind == "stacked-gradient"]
    assert gradients
    for f in gradients:
        assert {f.name} == _truth_names(truth, f.shape, f.current_sharding), f.instruction
    # Each pin names the weight and its gradient, in the model's words.
    for p in plan.placements:
        if p.kind == "pin-parameter":
            assert len(p.names) == 2 and p.names[1] == f"grad of {p.names[0]}", p.id
            assert any(without_layer(n) == (p.names[0], 0) for n in truth["parameter_names"]), p.id


def test_torch_xla_buffers_the_forward_keeps_for_the_backward_are_named() -> None:
    """torch_xla's scan keeps each layer's weights (transposed, times autograd's 1.0) and activations for its
    backward: a large buffer that holds one layer of a weight per trip is named after the weight, the rest
    are activations; none is left nameless."""
    plan = _torch_xla_plan(with_names=True)
    module = _inlined(DEFAULT_DUMP)
    kept = [f for f in plan.findings if f.kind == "large-buffer"]
    assert kept and all(f.name is not None for f in kept)
    table = name_table(module, parameter_names=_truth(BUNDLED_TRUTH)["parameter_names"])
    weights = {}  # a carried element's name -> its dims
    for loop in while_loops(module):
        for i, element in enumerate(loop.instruction.shape.elements):
            weights.setdefault(table.element(loop.name, i), element.dims)
    derived = [f for f in kept if f.name.startswith("derived from ")]
    assert derived and len(derived) < len(kept)
    for f in derived:
        weight = f.name.removeprefix("derived from ").removesuffix(", kept per layer for the backward")
        # One layer of the weight, transposed: the same elements per layer as the weight's stack.
        per_layer = [int(d) for d in re.findall(r"\d+", f.shape.split("[", 1)[1])]
        assert math.prod(weights[weight]) == math.prod(per_layer), f.name
    assert {f.name for f in kept} - {f.name for f in derived} == {"an activation kept per layer for the backward"}


def test_torch_xla_stacked_gradients_named_from_the_parameter_list() -> None:
    """The plain list of `named_parameters()` names, as a client would send it, names every stacked gradient."""
    truth = _truth(BUNDLED_TRUTH)
    module = _inlined(DEFAULT_DUMP)
    result = propagate(prepare(module))
    gradients = stacked_gradients(module, result)
    table = name_table(module, parameter_names=truth["parameter_names"], gradients=gradients)
    names: list[str | None] = []
    for g in gradients:
        assert g.sharding is not None
        names.append(table.element(g.loop, g.index))
        # Weights of one shape sharded alike (q, k, v) are told apart by the scan's order alone.
        assert names[-1] in _truth_names(truth, g.shape.to_text(False), g.sharding.to_text()), g.key
    across = {n.split(".", 1)[1] for n in truth["parameter_names"]}
    assert sorted(n or "" for n in names) == sorted(f"grad of {n}" for n in across)


def test_torch_xla_without_names_says_none_rather_than_guessing() -> None:
    plan = _torch_xla_plan(with_names=False)
    assert [f.name for f in plan.findings if f.kind == "stacked-gradient"] == [None]
    assert all(p.names == [] for p in plan.placements)


def test_jax_stacked_gradients_are_named_after_the_params_they_update() -> None:
    """`grad of params['wq']` for the accumulator whose output XLA's record calls `grads['wq']`."""
    truth = json.loads(JAX_DUMP.with_suffix(".xla.json").read_text())
    plan, _ = make_plan(prepare(parse_hlo_file(JAX_DUMP), mesh=_mesh(truth)))
    module = _inlined(JAX_DUMP)
    loops = {loop.name: loop for loop in while_loops(module)}
    gradients = [f for f in plan.findings if f.kind == "stacked-gradient"]
    assert gradients
    for f in gradients:
        (position,) = output_positions(module, loops[f.loop], f.index)
        output = truth["outputs"][position]
        key = re.fullmatch(r"grads\['(\w+)'\]", output).group(1)  # type: ignore[union-attr]
        assert f"params['{key}']" in truth["params"]
        assert f.name == f"grad of params['{key}']"
        assert f.shard_shape == truth["analysis"]["grad_output_shardings"][key]["shard_shape"]
    pins = {p.id: p.names for p in plan.placements if p.kind == "pin-parameter"}
    for f in gradients:
        parameter = f.name.removeprefix("grad of ")  # type: ignore[union-attr]
        assert pins[f"pin:{f.loop}[{f.index}]"] == [parameter, f.name]
    for b in plan.hbm.top_buffers_before:
        assert b.shard_shape is not None
        assert 4 * math.prod(b.shard_shape) == b.per_device_bytes, b.instruction
