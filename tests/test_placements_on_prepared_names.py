"""Placements are found on the module a compiler's passes leave and written into the module as written.

The fixture is a transformers Qwen2 step (q/k/v projections with biases, one AdamW step, decoder layers
through torch_xla 2.9's scan_layers, fsdp=4 x tensor=2), the module torch_xla compiled. XLA:TPU's
`tpu-reduce-rewriter` reduces each bias gradient before its reshape, making instructions
(`reduce.1`, `reshape.1`) the module as written does not have.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from planner import parse_hlo, parse_hlo_file
from planner.hlo.ir.module import HloModule
from planner.mesh import Mesh
from planner.plan.diagnosis.scan_pairs import layer_gradient, stacked_gradients
from planner.plan.fixes.front_names import Unwritable, front_placement, written_on_front
from planner.plan.fixes.placements import PIN_PARAMETER, Annotation, Placement, apply_placements, pin_parameter
from planner.plan.planner import make_plan
from planner.prepare import PreparedModule, annotate, prepare
from planner.propagation import ShardingPropagation

QWEN2 = Path(__file__).parent / "fixtures" / "torch_xla_qwen2_bias_scan_step.hlo.gz"
MESH = Mesh.parse("fsdp=4,tensor=2")
TARGETS = ["cpu", "v6e", "v5e"]

# A bias gradient reduced from a reshape that something else reads too: XLA:TPU's `tpu-reduce-rewriter`
# reduces `a` itself (`reduce.1 = f32[2,3]`) and reshapes the result (`reshape.1 = f32[6]`, `bias_grad`'s value).
BIAS_GRADIENT = """\
HloModule bias, entry_computation_layout={(f32[2,4,2,3]{3,2,1,0})->(f32[6]{0}, f32[2,4,6]{2,1,0})}

add_f32 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY e {
  a = f32[2,4,2,3] parameter(0)
  r = f32[2,4,6] reshape(a)
  z = f32[] constant(0)
  bias_grad = f32[6] reduce(r, z), dimensions={0,1}, to_apply=add_f32
  n = f32[2,4,6] negate(r)
  ROOT t = (f32[6], f32[2,4,6]) tuple(bias_grad, n)
}
"""


@pytest.fixture(scope="module")
def qwen2() -> HloModule:
    return parse_hlo_file(QWEN2)


@pytest.fixture(scope="module")
def prepared_qwen2(qwen2: HloModule) -> dict[str, PreparedModule]:
    return {target: prepare(qwen2, target, MESH) for target in TARGETS}


def _names(module: HloModule) -> dict[str, set[str]]:
    return {comp.name: {i.name for i in comp} for comp in module.computations}


def _pins(prepared: PreparedModule) -> list[Placement]:
    """Every pin-parameter placement the planner finds on the prepared module, in its names."""
    result = ShardingPropagation().apply(prepared)
    gradients = stacked_gradients(prepared.module, result, None, prepared.mesh)
    return [p for g in gradients if (p := pin_parameter(prepared.module, g)) is not None]


@pytest.mark.parametrize("target", TARGETS)
def test_the_plan_names_only_instructions_of_the_module_as_written(
    prepared_qwen2: dict[str, PreparedModule], target: str
) -> None:
    prepared = prepared_qwen2[target]
    plan, patched = make_plan(prepared)
    names = _names(prepared.front)
    for placement in plan.placements:
        for a in placement.annotations:
            assert a.instruction in names[a.computation], (placement.id, a)
    pinned = {i.name for comp in patched.computations for i in comp if i.name.endswith(".pinned")}
    assert len(pinned) == sum(len(p.annotations) for p in plan.placements if p.recommended)


@pytest.mark.parametrize("target", TARGETS)
def test_every_pin_is_written_on_instructions_of_the_module_as_written(
    prepared_qwen2: dict[str, PreparedModule], target: str
) -> None:
    prepared = prepared_qwen2[target]
    pins = _pins(prepared)
    assert len(pins) >= 3  # the three bias gradients among them
    written, unwritable = written_on_front(pins, prepared)
    assert unwritable == []
    front_names, module_names = _names(prepared.front), _names(prepared.module)
    for p in written:
        for a in p.annotations:
            assert a.instruction in front_names[a.computation], (p.id, a)
            assert prepared.resolve(a.instruction) in module_names[a.computation], (p.id, a)
    # Written into both modules, as the plan's simulations write them.
    annotate(prepared, lambda module: apply_placements(module, written, prepared.aliases))


def test_a_bias_gradient_pin_is_written_where_the_reduce_rewriter_moved_its_value(
    prepared_qwen2: dict[str, PreparedModule],
) -> None:
    prepared = prepared_qwen2["v6e"]
    assert prepared.made["reshape.1"] == "tpu-reduce-rewriter"
    assert prepared.resolve("reduce.2173") == "reshape.1"
    bias = next(p for p in _pins(prepared) if p.id == "pin:while.3094[40]")
    on_body = [a for a in bias.annotations if a.computation == "Body.2409"]
    assert [a.instruction for a in on_body] == ["reshape.1"]  # the bias's f32[256], not the f32[8,32] before it
    written = front_placement(bias, prepared)
    assert isinstance(written, Placement)
    assert [a.instruction for a in written.annotations if a.computation == "Body.2409"] == ["reduce.2173"]
    patched = annotate(prepared, lambda module: apply_placements(module, [written], prepared.aliases))
    front_pin = patched.front.computation("Body.2409")["reduce.2173.pinned"]
    module_pin = patched.module.computation("Body.2409")["reshape.1.pinned"]
    assert front_pin.operands == ("reduce.2173",) and module_pin.operands == ("reshape.1",)
    assert front_pin.sharding == module_pin.sharding


@pytest.mark.parametrize("chip", ["v6e", "v5e"])
def test_the_cli_plans_the_step_for_a_tpu_chip(chip: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "planner", "plan", str(QWEN2), "--mesh", "fsdp=4,tensor=2", "--chip", chip],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("plan for SyncTensorsGraph.4980 on mesh fsdp=4,tensor=2")


# -- the mapping, on a module small enough to read --------------------------------------------------------


@pytest.fixture(scope="module")
def bias_on_tpu() -> PreparedModule:
    prepared = prepare(parse_hlo(BIAS_GRADIENT), "v6e")
    assert dict(prepared.made) == {"reduce.1": "tpu-reduce-rewriter", "reshape.1": "tpu-reduce-rewriter"}
    assert prepared.resolve("bias_grad") == "reshape.1"
    return prepared


def _pin(instruction: str, sharding: str = "{devices=[2,4]<=[8] last_tile_dim_replicate}") -> Placement:
    return Placement(
        f"pin:{instruction}", PIN_PARAMETER, f"pin {instruction}", (), (Annotation("e", instruction, sharding),)
    )


@pytest.mark.parametrize(
    ("instruction", "on_front"),
    [
        ("n", "n"),  # no pass touched it: the same name
        ("reshape.1", "bias_grad"),  # the pass moved bias_grad's value, f32[6], here
    ],
    ids=["kept", "moved"],
)
def test_a_pin_is_written_on_the_instruction_of_the_same_value(
    bias_on_tpu: PreparedModule, instruction: str, on_front: str
) -> None:
    written = front_placement(_pin(instruction), bias_on_tpu)
    assert isinstance(written, Placement)
    assert [a.instruction for a in written.annotations] == [on_front]
    front = apply_placements(bias_on_tpu.front, [written], bias_on_tpu.aliases)
    module = apply_placements(bias_on_tpu.module, [written], bias_on_tpu.aliases)
    assert front.entry[f"{on_front}.pinned"].operands == (on_front,)
    assert module.entry[f"{instruction}.pinned"].operands == (instruction,)


def test_a_pin_of_an_instruction_only_a_pass_makes_is_unwritable_with_its_reason(bias_on_tpu: PreparedModule) -> None:
    pin = _pin("reduce.1", "{devices=[1,2,4]<=[8] last_tile_dim_replicate}")
    unwritable = front_placement(pin, bias_on_tpu)
    assert unwritable == Unwritable(
        pin,
        "pins reduce.1 in e, which XLA:TPU's tpu-reduce-rewriter makes; the module as written has no such "
        "instruction to annotate",
    )
    written, refused = written_on_front([pin, _pin("n")], bias_on_tpu)
    assert [p.id for p in written] == ["pin:n"] and refused == [unwritable]


def test_a_name_a_pass_gave_a_new_instruction_is_not_the_front_s_instruction(bias_on_tpu: PreparedModule) -> None:
    # `n` in both modules, but made by a pass (a retired name given to a new instruction): not the same value.
    reused = dataclasses.replace(bias_on_tpu, made={**bias_on_tpu.made, "n": "cse"})
    unwritable = front_placement(_pin("n"), reused)
    assert isinstance(unwritable, Unwritable)
    assert unwritable.reason.startswith("pins n in e, which XLA:TPU's cse makes")


def test_a_pin_in_a_computation_the_module_as_written_lacks_is_unwritable(bias_on_tpu: PreparedModule) -> None:
    pin = dataclasses.replace(_pin("x"), annotations=(Annotation("fused_body.1", "x", "{replicated}"),))
    unwritable = front_placement(pin, bias_on_tpu)
    assert isinstance(unwritable, Unwritable)
    assert "a computation XLA:TPU's passes make" in unwritable.reason


def test_applying_a_pin_of_an_absent_computation_is_refused(bias_on_tpu: PreparedModule) -> None:
    pin = dataclasses.replace(_pin("x"), annotations=(Annotation("fused_body.1", "x", "{replicated}"),))
    with pytest.raises(ValueError, match=r"placement names \['fused_body.1'\], not computations of module bias"):
        apply_placements(bias_on_tpu.front, [pin])


# -- the one-layer gradient a pin names ---------------------------------------------------------------------

SCANNED_BIAS = """\
HloModule scanned

add_f32 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY body {
  acc = f32[4,6] parameter(0)
  a = f32[2,4,2,3] parameter(1)
  i = s32[] parameter(2)
  z = f32[] constant(0)
  per_head = f32[2,3] reduce(a, z), dimensions={0,1}, to_apply=add_f32
  bias_grad = f32[6] reshape(per_head)
  layer = f32[1,6] reshape(bias_grad)
  zero = s32[] constant(0)
  ROOT dus = f32[4,6] dynamic-update-slice(acc, layer, i, zero)
}
"""


def test_the_layer_gradient_is_the_value_in_the_parameter_s_dims() -> None:
    # Back through the reshape that adds the layer dim, not through the one that regroups [2,3] into [6].
    body = parse_hlo(SCANNED_BIAS).entry
    assert layer_gradient(body, "dus") == "bias_grad"
