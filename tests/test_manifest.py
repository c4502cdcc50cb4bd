"""The client manifest: partition specs against XLA's shardings, and named placements."""

from __future__ import annotations

import json

import pytest
from conftest import CORPUS

from planner import parse_hlo, parse_hlo_file, parse_sharding
from planner.mesh import Mesh
from planner.plan.diagnosis.output_parameters import outputs_and_parameters
from planner.plan.manifest import Manifest, layer_relative
from planner.plan.planner import make_plan
from planner.prepare import prepare
from planner.sharding.partition_spec import spec_sharding

TRUTHS = sorted(CORPUS.glob("torch_xla/*.truth.json"))


@pytest.mark.parametrize("truth_path", TRUTHS, ids=[p.name.split(".")[0] for p in TRUTHS])
def test_partition_specs_mean_what_torch_xla_gave_xla(truth_path) -> None:
    """Every parameter's spec over the case's mesh equals the sharding torch_xla handed to XLA."""
    truth = json.loads(truth_path.read_text())
    mesh = Mesh(tuple(truth["mesh"]["shape"]), tuple(truth["mesh"]["axis_names"]), tuple(truth["mesh"]["device_ids"]))
    checked = 0
    for name, spec in truth["param_partition_specs"].items():
        assert spec_sharding(spec, mesh) == parse_sharding(truth["xla_param_shardings"][name]), name
        checked += 1
    assert checked > 0


@pytest.mark.parametrize(
    "spec,expected",
    [
        (["tp", "fsdp"], "{devices=[2,4]0,2,4,6,1,3,5,7}"),
        (["fsdp", None], "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
        ([None, "tp"], "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
        ([["fsdp", "tp"], None], "{devices=[8,1]0,1,2,3,4,5,6,7}"),
        ([["tp", "fsdp"], None], "{devices=[8,1]0,2,4,6,1,3,5,7}"),
        ([None, None], "{replicated}"),
    ],
    ids=["tp_fsdp", "fsdp_none", "none_tp", "fsdp*tp", "tp*fsdp", "replicated"],
)
def test_spec_sharding_table(spec: list, expected: str) -> None:
    assert spec_sharding(spec, Mesh.parse("fsdp=4,tp=2")) == parse_sharding(expected)


def test_bad_specs_name_the_problem() -> None:
    mesh = Mesh.parse("fsdp=4,tp=2")
    with pytest.raises(ValueError, match=r"names \['dp'\], not axes of mesh fsdp=4,tp=2"):
        spec_sharding(["dp", None], mesh)
    with pytest.raises(ValueError, match="uses a mesh axis twice"):
        spec_sharding(["tp", "tp"], mesh)


@pytest.mark.parametrize(
    "name,relative",
    [("3.d.weight", "d.weight"), ("layers.12.mlp.down.weight", "mlp.down.weight"), ("params['wq']", "params['wq']")],
)
def test_layer_relative_names(name: str, relative: str) -> None:
    assert layer_relative(name) == relative


def _llama_manifest(truth: dict) -> Manifest:
    """What a client knows of the captured step: loss first, then each parameter's gradient, in order."""
    d, ff = int(truth["config"]["D"]), int(truth["config"]["FF"])
    shapes = {
        "q": [d, d],
        "k": [d, d],
        "v": [d, d],
        "o": [d, d],
        "g": [ff, d],
        "u": [ff, d],
        "d": [d, ff],
        "n1": [d],
        "n2": [d],
    }
    parameters = []
    for name in truth["parameter_names"]:
        shape = shapes[name.split(".")[1]]
        spec = truth["param_partition_specs"].get(name, [None] * len(shape))
        parameters.append({"name": name, "shape": shape, "partition_spec": spec})
    return Manifest(outputs=[None, *truth["parameter_names"]], parameters=parameters)


def test_manifest_names_every_gradient_and_gives_pytorch_placements() -> None:
    truth = json.loads((CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.truth.json").read_text())
    manifest = _llama_manifest(truth)
    mesh = Mesh.parse("fsdp=4,tp=2")
    plan, _ = make_plan(
        prepare(parse_hlo_file(CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.captured.hlo"), mesh=mesh),
        manifest=manifest,
    )
    (down,) = [f for f in plan.findings if f.kind == "stacked-gradient"]
    assert down.matched_parameter == "d.weight"
    # The ideal is the parameter's own sharding, stacked: what XLA gave `0.d.weight` with a layer dim in front.
    per_layer = parse_sharding(truth["xla_param_shardings"]["0.d.weight"])
    assert parse_sharding(down.ideal_sharding).shard_shape((8, 1024, 4096)) == (8, *per_layer.shard_shape((1024, 4096)))
    pins = {p.torch.parameter: p.torch for p in plan.placements if p.torch is not None and p.recommended}
    # Every weight the fixed run pinned is pinned here, with the spec the user gave it.
    for name in ("q", "k", "v", "o", "g", "u", "d"):
        pin = pins[f"{name}.weight"]
        assert pin.partition_spec == truth["param_partition_specs"][f"0.{name}.weight"]
        assert pin.call == "mark_sharding_with_gradients"


def test_manifest_that_does_not_fit_is_refused_with_the_mismatch() -> None:
    truth = json.loads((CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.truth.json").read_text())
    manifest = _llama_manifest(truth)
    wrong_shape = manifest.model_copy(deep=True)
    wrong_shape.parameters[6].shape = [4096, 1024]  # 0.d.weight is [1024, 4096]
    with pytest.raises(
        ValueError, match=r"'0.d.weight' has shape=\[4096, 1024\], but its stacked gradient is f32\[8,1024,4096\]"
    ):
        make_plan(
            prepare(
                parse_hlo_file(CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.captured.hlo"),
                mesh=Mesh.parse("fsdp=4,tp=2"),
            ),
            manifest=wrong_shape,
        )
    bad = manifest.model_copy(deep=True)
    bad.parameters[6].partition_spec = ["fsdp"]  # 0.d.weight is 2-D
    module = parse_hlo_file(CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.captured.hlo")
    with pytest.raises(ValueError, match=r"'0.d.weight' has shape=\[1024, 4096\] and partition_spec=\['fsdp'\]"):
        make_plan(prepare(module, mesh=Mesh.parse("fsdp=4,tp=2")), manifest=bad)
    unknown = manifest.model_copy(deep=True)
    unknown.outputs[7] = "0.down.weight"
    with pytest.raises(
        ValueError, match=r"names parameter '0.down.weight', which the manifest's parameters do not list"
    ):
        make_plan(prepare(module, mesh=Mesh.parse("fsdp=4,tp=2")), manifest=unknown)
    with pytest.raises(ValueError, match="a manifest needs the mesh"):
        make_plan(prepare(module), manifest=manifest)


# An LM's embedding and head are both [vocab, hidden]; torch_xla numbers entry parameters in the order the
# graph first reads them (the head here), and returns the gradients in the model's order (the embedding's first).
SAME_DIMS = """HloModule same_dims

ENTRY main {
  head = f32[64,32]{1,0} parameter(0), sharding={devices=[2,4]0,2,4,6,1,3,5,7}
  embed = f32[64,32]{1,0} parameter(1), sharding={devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}
  loss = f32[] constant(0)
  grad_embed = f32[64,32]{1,0} multiply(embed, embed)
  grad_head = f32[64,32]{1,0} add(head, head)
  ROOT out = (f32[], f32[64,32]{1,0}, f32[64,32]{1,0}) tuple(loss, grad_embed, grad_head)
}
"""


def test_a_manifest_pairs_a_gradient_with_the_parameter_it_names_among_those_of_the_same_dims() -> None:
    module = parse_hlo(SAME_DIMS)
    by_dims = {position: p.name for position, _, p in outputs_and_parameters(module)}
    assert by_dims == {1: "head", 2: "embed"}  # the first free parameter of the dims: a guess, wrong here
    manifest = Manifest(
        outputs=[None, "model.embed_tokens.weight", "lm_head.weight"],
        parameters=[
            {"name": "model.embed_tokens.weight", "shape": [64, 32], "partition_spec": ["fsdp", None]},
            {"name": "lm_head.weight", "shape": [64, 32], "partition_spec": ["tensor", "fsdp"]},
        ],
    )
    mesh = Mesh.parse("fsdp=4,tensor=2")
    named = {position: p.name for position, _, p in outputs_and_parameters(module, manifest, mesh)}
    assert named == {1: "embed", 2: "head"}
    # torch_xla's module without a manifest: its order says nothing, so neither output is paired.
    torch_xla = parse_hlo(SAME_DIMS.replace("HloModule same_dims", "HloModule SyncTensorsGraph.9"))
    assert dict((position, p.name) for position, _, p in outputs_and_parameters(torch_xla)) == {}
    assert {position: p.name for position, _, p in outputs_and_parameters(torch_xla, manifest, mesh)} == named
