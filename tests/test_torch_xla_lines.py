"""Every torch_xla line a plan prints is Python that runs against the user's model.

A line names the weight as the model holds it (`layer.mlp.down_proj.weight` inside the scanned layer,
`model.model.embed_tokens.weight.grad` for a returned gradient), one line per weight; where the step names no
parameter (a torch_xla dump planned without a manifest) there is no line, and the plan says why in words.
Checked on the forms one by one, on the plans of the bundled dump, the corpus and the grid, on the README,
and against transformers' models: each line, run with `model` and `layer` in scope, reaches the parameter.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CORPUS, REPO
from test_manifest import _llama_manifest

from api.views import placement_code, placement_text
from cli.plan_command import render_plan
from planner import parse_hlo_file
from planner.data import DEFAULT_DUMP
from planner.hlo.structure.frontend import TORCH_XLA
from planner.memory import chip
from planner.mesh import Mesh
from planner.plan.fixes.placements import (
    MARK_GRADIENT,
    PIN_OUTPUT,
    PIN_PARAMETER,
    PinnedValue,
    Placement,
    TorchPin,
)
from planner.plan.fixes.user_form import UserForm, user_form
from planner.plan.manifest import layer_relative
from planner.plan.model import Plan, TorchPinInfo
from planner.plan.planner import make_plan
from planner.prepare import prepare
from planner.sharding.text import parse_sharding

MESH = Mesh.parse("fsdp=4,tp=2")
# One layer's [1024,4096] weight split 4 ways over fsdp on dim 0 and 2 over tp on dim 1: ('fsdp', 'tp').
SHARDING = parse_sharding("{devices=[4,2]<=[8]}")
LABEL = "while.953[6], kept per layer for the backward"


def _placement(kind: str, parameter: str | None = None, label: str | None = None) -> Placement:
    """A pin of a [1024,4096] weight carried at while.953[6]; `parameter` is a manifest's name for it."""
    shape = (1024, 4096)
    return Placement(
        id=f"{kind}:test",
        kind=kind,
        summary="the HLO form",
        fixes=("while.2384[38]",),
        annotations=(),
        torch_pin=TorchPin(parameter, ("fsdp", "tp"), shape) if parameter is not None else None,
        pinned=PinnedValue(SHARDING, shape, label, key="while.953[6]" if kind == PIN_PARAMETER else None),
    )


def _form(kind: str, parameter: str | None = None, label: str | None = None, framework: str = TORCH_XLA) -> UserForm:
    form = user_form(_placement(kind, parameter, label), framework, MESH, [label] if label else [])
    assert form is not None
    return form


def _assert_runs_or_says_why(form: UserForm) -> None:
    if form.code is None:
        assert form.missing, form
    else:
        compile(form.code, "<plan>", "exec")
    assert "<" not in form.summary and "<" not in (form.code or ""), form


@pytest.mark.parametrize(
    "kind,parameter,code",
    [
        (PIN_PARAMETER, "mlp.down_proj.weight",
         "mlp_down_proj_weight = xs.mark_sharding_with_gradients(layer.mlp.down_proj.weight, mesh, ('fsdp', 'tp'))"),
        (PIN_PARAMETER, "block_sparse_moe.experts.3.w1.weight",
         "block_sparse_moe_experts_3_w1_weight = xs.mark_sharding_with_gradients("
         "layer.block_sparse_moe.experts[3].w1.weight, mesh, ('fsdp', 'tp'))"),
        (PIN_PARAMETER, "mlp.gate_proj.weight|mlp.up_proj.weight",
         "mlp_gate_proj_weight = xs.mark_sharding_with_gradients(layer.mlp.gate_proj.weight, mesh, ('fsdp', 'tp'))\n"
         "mlp_up_proj_weight = xs.mark_sharding_with_gradients(layer.mlp.up_proj.weight, mesh, ('fsdp', 'tp'))"),
        (PIN_OUTPUT, "model.embed_tokens.weight", "xs.mark_sharding(model.model.embed_tokens.weight.grad, mesh, ('fsdp', 'tp'))"),
        (PIN_OUTPUT, "lm_head.weight", "xs.mark_sharding(model.lm_head.weight.grad, mesh, ('fsdp', 'tp'))"),
        (PIN_OUTPUT, "model.layers.0.mlp.up_proj.weight",
         "xs.mark_sharding(model.model.layers[0].mlp.up_proj.weight.grad, mesh, ('fsdp', 'tp'))"),
        (PIN_OUTPUT, "0.d.weight", "xs.mark_sharding(model[0].d.weight.grad, mesh, ('fsdp', 'tp'))"),
    ],
    ids=["layer_relative", "layer_relative_with_a_position", "one_line_per_weight", "model_level", "lm_head",
         "model_level_in_a_layer", "sequential_model"],
)  # fmt: skip
def test_a_manifest_s_name_is_the_attribute_the_line_pins(kind: str, parameter: str, code: str) -> None:
    form = _form(kind, parameter)
    assert form.code == code and form.missing is None
    assert form.parameter == parameter and parameter in form.summary
    _assert_runs_or_says_why(form)


@pytest.mark.parametrize(
    "kind,parameter,label",
    [
        (PIN_PARAMETER, None, LABEL),
        (PIN_PARAMETER, None, None),
        (PIN_OUTPUT, None, "aten__permute"),
        (PIN_OUTPUT, None, None),
    ],
    ids=["a_label_of_the_dump", "no_name", "an_op_name_as_label", "a_returned_gradient_without_a_name"],
)
def test_without_a_manifest_s_name_there_is_no_line_and_the_plan_says_why(
    kind: str, parameter: str | None, label: str | None
) -> None:
    form = _form(kind, parameter, label)
    assert form.code is None and form.parameter is None
    assert form.missing is not None and "the dump names no parameter" in form.missing and "manifest" in form.missing
    # Still told apart from the other weights: its shape, and where the step carries or returns it.
    where = "while.953[6]" if kind == PIN_PARAMETER else "while.2384[38]"
    assert f"the [1024,4096] parameter at {where}" in form.summary
    assert form.spec_text == "('fsdp', 'tp')" and form.spec_text in form.summary
    assert LABEL not in form.summary and LABEL not in form.where
    _assert_runs_or_says_why(form)


@pytest.mark.parametrize(
    "parameter",
    ["params['wq']", "layers.0.mlp.lambda.weight", "mlp.down proj.weight", "mlp..weight", "mlp.01.weight"],
    ids=["a_jax_path", "a_keyword", "a_space", "an_empty_part", "not_a_position"],
)
def test_a_manifest_name_no_attribute_access_can_reach_has_no_line(parameter: str) -> None:
    form = _form(PIN_PARAMETER, parameter)
    assert form.code is None and form.missing is not None and "named_parameters()" in form.missing
    _assert_runs_or_says_why(form)


@pytest.mark.parametrize(
    "kind,label,code",
    [
        (PIN_PARAMETER, "params['w_down']",
         "w_down = jax.lax.with_sharding_constraint(w_down, NamedSharding(mesh, P('fsdp', 'tp')))"),
        (PIN_PARAMETER, LABEL, "w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P('fsdp', 'tp')))"),
        (PIN_PARAMETER, "params['class']",
         "w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P('fsdp', 'tp')))"),
        (PIN_OUTPUT, "params['embed']",
         "grads['embed'] = jax.lax.with_sharding_constraint(grads['embed'], NamedSharding(mesh, P('fsdp', 'tp')))"),
        (PIN_OUTPUT, "params['w'], kept per layer for the backward",
         "grad = jax.lax.with_sharding_constraint(grad, NamedSharding(mesh, P('fsdp', 'tp')))"),
    ],
    ids=["a_path", "a_label", "a_keyword_key", "a_returned_gradient", "a_label_like_a_path"],
)  # fmt: skip
def test_a_jax_line_is_python_whatever_the_name(kind: str, label: str, code: str) -> None:
    form = _form(kind, label=label, framework="jax")
    assert form.code == code
    _assert_runs_or_says_why(form)


def _torch_xla_lines(plan: Plan) -> list[str]:
    """Every torch_xla line the plan is printed with: the CLI's, the dashboard's, the client's log."""
    from scan_runtime.auto import plan_lines
    from scan_runtime.client import PlanResult

    text = render_plan(plan)
    assert "<the weight>" not in text
    lines = [line.strip().removeprefix("torch_xla: ") for line in text.splitlines() if "torch_xla: " in line]
    for i, p in enumerate(plan.placements):
        if p.user is not None and p.user.framework == TORCH_XLA and p.user.code is not None:
            assert p.user.code in text
            lines.append(p.user.code)
        code = placement_code(plan, i)
        lines += [code] if code is not None else []
        lines += [line for line in placement_text(plan, i).splitlines() if "xs." in line]
    for line in plan_lines(PlanResult(plan, "abc", "in-process")):
        assert "<the weight>" not in line
        if "xs." in line:
            lines.append(line[line.index(": ", line.index(" to (")) + 2 :])
    return lines


def _assert_every_line_compiles(plan: Plan) -> int:
    for p in plan.placements:
        if p.user is not None:
            assert p.user.code is not None or p.user.missing, p.id
    lines = _torch_xla_lines(plan)
    for line in lines:
        compile(line, "<plan>", "exec")
    return len(lines)


def _plan(path: Path, target: str, mesh: Mesh = MESH, **options: Any) -> Plan:
    capacity = chip(target).hbm_bytes if target != "cpu" else None
    plan, _ = make_plan(prepare(parse_hlo_file(path), target, mesh), capacity, **options)
    return plan


@pytest.mark.parametrize("target", ["cpu", "v6e"], ids=["xla_cpu", "v6e"])
def test_the_bundled_dump_s_plan_prints_no_placeholder_and_no_line_it_cannot_name(target: str) -> None:
    plan = _plan(DEFAULT_DUMP, target)
    pins = [p for p in plan.placements if p.kind in (PIN_PARAMETER, PIN_OUTPUT)]
    assert pins
    # The dump names no parameter: no line, the reason in words, and each pin told apart by shape and place.
    assert all(p.user is not None and p.user.code is None and p.user.missing for p in pins)
    assert len({p.user.summary for p in pins if p.user is not None}) == len(pins)
    assert _assert_every_line_compiles(plan) == 0
    assert "kept per layer for the backward, mesh" not in render_plan(plan)


@pytest.mark.parametrize("target", ["cpu", "v6e"], ids=["xla_cpu", "v6e"])
def test_a_plan_with_a_manifest_prints_a_line_per_weight_that_compiles(target: str) -> None:
    step = CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2"
    manifest = _llama_manifest(json.loads(step.with_suffix(".truth.json").read_text()))
    plan = _plan(step.with_suffix(".captured.hlo"), target, manifest=manifest)
    pins = [p for p in plan.placements if p.kind == PIN_PARAMETER]
    assert pins and all(p.user is not None and p.user.code is not None for p in pins)
    assert _assert_every_line_compiles(plan) >= len(pins)
    assert all(re.fullmatch(r"\w+ = xs\.mark_sharding_with_gradients\(layer\.\w+\.weight, mesh, \(.*\)\)",
                            p.user.code or "") for p in pins if p.user is not None)  # fmt: skip


# The corpus's torch_xla steps as torch_xla handed them to XLA (not the dumps taken at the propagation pass).
CORPUS_STEPS = sorted(p for p in CORPUS.glob("torch_xla/*.hlo") if not p.name.endswith(".pass_input.hlo"))


@pytest.mark.parametrize("path", CORPUS_STEPS, ids=lambda p: p.stem)
def test_every_torch_xla_line_of_the_corpus_compiles(path: Path) -> None:
    _assert_every_line_compiles(_plan(path, "cpu"))


@pytest.mark.xla
def test_every_torch_xla_line_of_the_grid_compiles() -> None:
    """The grid's torch_xla steps (the CI subset's), each planned for XLA:CPU over its own mesh."""
    from fidelity.cases import CI_SUBSET
    from fidelity.references import ensure_references, reference_path

    cases = [c for c in CI_SUBSET if c.front_end == TORCH_XLA]
    assert cases and not ensure_references(cases)
    kinds = set()
    for case in cases:
        mesh = Mesh(case.mesh.shape, case.mesh.axis_names, tuple(range(case.mesh.num_devices)))
        plan = _plan(reference_path(case), "cpu", mesh)
        _assert_every_line_compiles(plan)
        kinds |= {p.kind for p in plan.placements}
    # Pins in the scanned layer and on returned gradients among them, each with its line or its reason.
    assert {PIN_PARAMETER, PIN_OUTPUT} <= kinds


def test_the_dashboard_s_edits_carry_a_manifest_s_line_only_where_it_reaches_a_weight() -> None:
    """Where the plan has no line of its own (the dump names no parameter) but a manifest's pin does, the HLO
    edits to paste start with the manifest's torch_xla line: on `.grad` for a returned gradient."""
    plan = _plan(CORPUS / "torch_xla" / "llama_loop_L4_fsdp4_tp2.hlo", "cpu")
    index, p = next((i, p) for i, p in enumerate(plan.placements) if p.kind == PIN_OUTPUT)
    assert p.user is not None and p.user.code is None
    p.torch = TorchPinInfo(parameter="model.layers.0.mlp.down_proj.weight", partition_spec=["fsdp", ["tp"]],
                           shape=[512, 2048], call=MARK_GRADIENT)  # fmt: skip
    assert placement_text(plan, index).splitlines()[:2] == [
        "# after backward (torch_xla.distributed.spmd as xs)",
        "xs.mark_sharding(model.model.layers[0].mlp.down_proj.weight.grad, mesh, ('fsdp', ('tp',)))",
    ]
    p.torch = p.torch.model_copy(update={"parameter": LABEL})
    assert "xs." not in placement_text(plan, index)


def _readme_lines() -> list[str]:
    """The README's torch_xla lines: printed by a plan (`torch_xla: ...` in an output block) or quoted in the
    prose (`` `... = xs.mark_sharding_with_gradients(...)` ``)."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    printed = [line.strip().removeprefix("torch_xla: ") for block in blocks for line in block.splitlines()
               if line.strip().startswith("torch_xla: ")]  # fmt: skip
    prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
    return printed + [span for span in re.findall(r"`([^`]+)`", prose) if "xs." in span]


def test_every_torch_xla_line_of_the_readme_compiles() -> None:
    text = (REPO / "README.md").read_text()
    assert "<the weight>" not in text
    lines = _readme_lines()
    assert lines
    for line in lines:
        compile(line, "<README>", "exec")


class _Pins:
    """Stands in for `torch_xla.distributed.spmd`: records the tensor each line pins."""

    def __init__(self) -> None:
        self.pinned: list[torch.Tensor] = []

    def mark_sharding(self, tensor: torch.Tensor, mesh: object, spec: tuple) -> None:
        self.pinned.append(tensor)

    def mark_sharding_with_gradients(self, tensor: torch.Tensor, mesh: object, spec: tuple) -> torch.Tensor:
        self.pinned.append(tensor)
        return tensor


def _run(code: str, model: torch.nn.Module, layer: torch.nn.Module) -> list[torch.Tensor]:
    xs = _Pins()
    exec(compile(code, "<plan>", "exec"), {"xs": xs, "mesh": None, "model": model, "layer": layer})
    return xs.pinned


def _transformers_model(name: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    small = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
             "num_hidden_layers": 2, "vocab_size": 256}  # fmt: skip
    config, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    }[name]
    extra = {"num_local_experts": 4} if name == "mixtral" else {"pad_token_id": 0, "eos_token_id": 1}
    return model_class(config(**small, **extra))


class _Experts(torch.nn.Module):
    """A layer whose weights sit in lists: the names inside the layer carry positions (`experts.1.weight`)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Experts() for _ in range(2)])


def _model(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model, and its first decoder layer (what `layer` is inside the scanned layer function)."""
    if name == "experts_in_lists":
        stack = _Stack()
        return stack, stack.layers[0]
    model = _transformers_model(name)
    return model, model.model.layers[0]


@pytest.mark.parametrize("name", ["llama", "phi3", "mixtral", "experts_in_lists"])
def test_each_line_reaches_the_parameter_it_names_on_the_model(name: str) -> None:
    """For every parameter `model.named_parameters()` names (what scan_runtime's manifest sends): as a model-level
    gradient, the line pins that parameter's `.grad`; as a name inside the scanned layer (layer 0's weights),
    the line pins that weight of `layer`."""
    model, layer = _model(name)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    in_layer = {id(p) for p in layer.parameters()}
    checked = 0
    for full, parameter in model.named_parameters():
        output = _form(PIN_OUTPUT, full)
        assert output.code is not None, full
        assert [t is parameter.grad for t in _run(output.code, model, layer)] == [True], (full, output.code)
        if id(parameter) in in_layer:
            relative = layer_relative(full)
            pin = _form(PIN_PARAMETER, relative)
            assert pin.code is not None, relative
            assert [t is parameter for t in _run(pin.code, model, layer)] == [True], (relative, pin.code)
            checked += 1
    assert checked == len(in_layer) > 0


def test_the_readme_s_lines_reach_a_llama_s_weights() -> None:
    model, layer = _model("llama")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for line in _readme_lines():
        assert len(_run(line, model, layer)) == 1, line
