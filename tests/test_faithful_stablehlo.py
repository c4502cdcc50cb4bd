"""jaxlib compiles torch_xla's modules as torch_xla does when given the faithful StableHLO.

The corpus's truth files hold torch_xla's own run of each step: the sum of XLA:CPU's buffer
allocations per device and the While shapes right after SPMD partitioning. jaxlib's XLA:CPU on the
faithful conversion must give both back exactly, measured the same way (the sum of all allocations
of its own buffer assignment); that is what lets XLA:TPU, which only jaxlib reaches, stand for the
step. The small modules under `fixtures/round_trip` are ones the conversion keeps or refuses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import CORPUS

from planner.data import DEFAULT_DUMP
from planner.errors import UnfaithfulConversion
from planner.hlo.structure.seal import SealInstructions, SealLoopPassThrough
from planner.hlo.text.compat import for_jaxlib_0_7
from planner.hlo.text.parser import parse_hlo, parse_hlo_file
from planner.hlo.text.printer import print_module
from planner.plan.compilers.verify import (
    FAITHFUL,
    Predicted,
    Texts,
    compile_forms,
    compile_with_xla,
    output_propagation,
    verify_on_tpu,
)
from planner.prepare import prepare

TRUTHS = sorted((CORPUS / "torch_xla").glob("*.truth.json"))
ROUND_TRIP = Path(__file__).parent / "fixtures" / "round_trip"
_LEAF = re.compile(r"[a-z][a-z0-9]*\[[0-9,]*\]")


def _leaves(whiles: list[dict]) -> list[list[str]]:
    return [_LEAF.findall(w["shape"]) for w in whiles]


@pytest.mark.xla
@pytest.mark.parametrize("truth_path", TRUTHS, ids=[p.name.removesuffix(".truth.json") for p in TRUTHS])
def test_jaxlib_xla_cpu_on_the_faithful_stablehlo_allocates_torch_xlas_bytes(truth_path: Path) -> None:
    truth = json.loads(truth_path.read_text())
    text = (truth_path.parent / truth["hlo"]).read_text()
    report = compile_with_xla(text, len(truth["mesh"]["device_ids"]), output_propagation(parse_hlo(text)))
    assert report["stablehlo"] == "faithful"
    assert report["allocated_bytes"] == truth["xla_per_device_total_bytes"]
    assert _leaves(report["while_shapes"]) == _leaves(truth["xla_post_partition_while_shapes"])


@pytest.mark.xla
@pytest.mark.parametrize(
    "fixture,refusal",
    [
        ("root_identity", None),  # the identity folds, a root too: the check expects it gone
        ("loop_pass_through", None),  # an element passed through an inlined call's tuple still passes through
        ("buffer_donor", None),  # the header's donors come back as jax.buffer_donor arguments
        ("one_operand_concatenate", None),  # ConcatenateOp::fold: an identity like the others
        ("unit_dim_iota", None),  # IotaBroadcast: s64[1,16] iota -> s64[16] iota + reshape, expected as such
        ("convert_to_pred", None),  # u8 and s32 to pred: a compare against zero, expected as such
        ("unit_dim_inside", "the canonicalizer turns it into a reshape"),
        ("sharded_convert_to_pred", "p is a convert to pred with sharding {devices=[8,1]<=[8]}"),
        ("sharded_identity", "r is an identity reshape with sharding {replicated}"),
        ("sharded_concatenate", "c is an identity concatenate with sharding {replicated}"),
        ("sharded_unit_dim_iota", "i is an iota s64[1,16] with sharding {devices=[1,8]<=[8]}"),
        ("broadcast_iota", "i = s64[4,16] iota in main.1"),  # a real broadcast after the 1-D iota: not split
        ("nested_loop_tuple", "does not come back from jaxlib's compile path as the same module"),
    ],
)
def test_the_conversion_keeps_a_module_or_refuses_it_with_the_reason(fixture: str, refusal: str | None) -> None:
    from planner.plan.compilers.stablehlo import faithful_stablehlo

    module = parse_hlo_file(ROUND_TRIP / f"{fixture}.hlo")
    if refusal is None:
        faithful_stablehlo(module)
        return
    with pytest.raises(UnfaithfulConversion, match=re.escape(refusal)):
        faithful_stablehlo(module)


@pytest.mark.xla
def test_the_round_trip_check_refuses_what_the_plain_conversion_gives_back() -> None:
    """hlo_to_stablehlo alone: the canonicalizer folds the bundled dump's broadcasts, slices and loop tuples."""
    from planner.plan.compilers.round_trip import check_round_trip
    from planner.plan.compilers.stablehlo import faithful_stablehlo, plain_stablehlo

    text = for_jaxlib_0_7(DEFAULT_DUMP.read_text())
    module = parse_hlo(text)
    with pytest.raises(UnfaithfulConversion, match="does not come back"):
        check_round_trip(module, plain_stablehlo(text))
    converted = faithful_stablehlo(module)
    assert (converted.num_sealed, converted.num_pass_through, converted.num_kept_broadcasts) == (1613, 118, 37)


@pytest.mark.xla
def test_the_round_trip_check_refuses_a_conversion_that_drops_buffer_donors() -> None:
    """hlo_to_stablehlo alone drops `buffer_donor`; XLA could then not reuse a donated buffer for an output."""
    from planner.memory.donation import buffer_donors
    from planner.plan.compilers.round_trip import check_round_trip
    from planner.plan.compilers.stablehlo import plain_stablehlo

    text = (ROUND_TRIP / "buffer_donor.hlo").read_text()
    module = parse_hlo(text)
    assert buffer_donors(module) == {(1, ())}
    with pytest.raises(
        UnfaithfulConversion, match=re.escape("donating parameters [] where the module donates [(1, ())]")
    ):
        check_round_trip(module, plain_stablehlo(text))


@pytest.mark.xla
def test_verify_withholds_xla_tpu_for_a_module_the_conversion_refuses() -> None:
    pytest.importorskip("libtpu")
    text = (ROUND_TRIP / "unit_dim_inside.hlo").read_text()
    tpu, skipped = verify_on_tpu(Texts(text, text, text), 8, False, "v6e:2x4", Predicted(0, 0), None)
    assert tpu is None and skipped is not None
    assert skipped.startswith("XLA:TPU is reached only through jaxlib's StableHLO, and the module has none")
    assert "the canonicalizer turns it into a reshape" in skipped


@pytest.mark.xla
def test_the_forms_verify_writes_compile_as_the_given_jax_step_does() -> None:
    """A call is a wall for MLIR's canonicalizer, and XLA inlines calls only after it: a JAX step as given
    went through jaxlib's compile path with its calls, its inlined form never did. Handed over plainly, the
    canonicalizer rewrites across the inlined calls (the corpus step: 64 bytes per device apart; a GPT-2
    step with tied embeddings on v5e: 994.8 MiB as given, 1,413.1 MiB inlined); through the faithful
    conversion the inlined form compiles to the given step's bytes."""
    text = (CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo").read_text()
    module = parse_hlo(text)
    flags = output_propagation(module)
    inlined = print_module(prepare(module, "cpu").front)
    conversions: list[tuple[str, str | None]] = []

    def compile_text(t: str, conversion: str | None) -> dict:
        conversions.append(("given" if t == text else "inlined", conversion))
        return compile_with_xla(t, 8, flags, conversion=conversion)

    given, before, after = compile_forms(Texts(text, inlined, inlined), compile_text, FAITHFUL)
    assert conversions == [("given", None), ("inlined", FAITHFUL)]
    assert before["total_bytes"] == after["total_bytes"] == given["total_bytes"]
    assert compile_with_xla(inlined, 8, flags)["total_bytes"] != given["total_bytes"]


@pytest.mark.xla
def test_derived_forms_the_faithful_conversion_refuses_compile_as_the_given_one() -> None:
    """JAX's pinned step carries a sharding on an identity reshape that MLIR folds away: the faithful
    conversion refuses its inlined form, and both derived forms compile as the given one does, so
    before and after still differ by the change set alone."""
    text = (CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2_pinned.hlo").read_text()
    module = parse_hlo(text)
    flags = output_propagation(module)
    inlined = print_module(prepare(module, "cpu").front)
    conversions: list[str | None] = []

    def compile_text(t: str, conversion: str | None) -> dict:
        conversions.append(conversion)
        return compile_with_xla(t, 8, flags, conversion=conversion)

    given, before, after = compile_forms(Texts(text, inlined, inlined), compile_text, FAITHFUL)
    assert conversions == [None, FAITHFUL, None]
    assert before is after and before["stablehlo"] == given["stablehlo"] == "plain"
    with pytest.raises(UnfaithfulConversion, match="identity reshape with sharding"):
        compile_with_xla(inlined, 8, flags, conversion=FAITHFUL)


@pytest.mark.parametrize(
    "iota,parts",
    [
        (
            "s64[1,8192]{1,0} iota(), iota_dimension=1",
            ("s64[8192]{0} iota(), iota_dimension=0", "s64[1,8192]{1,0} reshape"),
        ),
        (
            "f32[2,1,1]{2,1,0} iota(), iota_dimension=0",
            ("f32[2]{0} iota(), iota_dimension=0", "f32[2,1,1]{2,1,0} reshape"),
        ),
        ("s64[4,16]{1,0} iota(), iota_dimension=1", None),  # becomes a real broadcast: left to the check
        ("s64[1,1]{1,0} iota(), iota_dimension=1", None),  # an iota dim of 1 folds to a zero constant instead
        ("s64[16]{0} iota(), iota_dimension=0", None),  # rank 1: left alone
    ],
    ids=["row", "column", "broadcast", "zeros", "rank1"],
)
def test_an_iota_with_unit_dims_is_expected_as_the_1d_iota_and_reshape_mlir_makes(
    iota: str, parts: tuple[str, str] | None
) -> None:
    from planner.hlo.text.printer import print_instruction
    from planner.plan.compilers.round_trip import canonicalized_alone, split_iota_of

    module = parse_hlo(f"HloModule m\n\nENTRY %e {{\n  ROOT %i = {iota}\n}}\n")
    split = split_iota_of(module.entry, module.entry.root)
    if parts is None:
        assert split is None and canonicalized_alone(module).split_iotas == ()
        return
    assert split is not None
    new_iota, reshape = split
    assert print_instruction(new_iota).split(" = ", 1)[1] == parts[0]
    assert reshape.name == "i" and reshape.operands == (new_iota.name,)
    assert f"{reshape.shape.to_text()} {reshape.opcode}" == parts[1]
    canonical = canonicalized_alone(module)
    assert canonical.split_iotas == ("i",) and canonical.module.entry.root_name == "i"


def test_sealing_gives_each_instruction_a_computation_and_leaves_annotated_ones() -> None:
    module = parse_hlo(
        "HloModule m\n\nENTRY %e {\n  %x = f32[8]{0} parameter(0)\n"
        '  %s = f32[8]{0} custom-call(%x), custom_call_target="Sharding", sharding={replicated}\n'
        "  ROOT %m = f32[8]{0} multiply(%s, %s)\n}\n"
    )
    sealed = SealInstructions().apply(module)
    entry = sealed.module.entry
    assert sealed.num_calls == 1 and [i.opcode for i in entry] == ["parameter", "custom-call", "call"]
    callee = sealed.module.computation(entry.root.attr("to_apply").names[0])
    # One parameter per operand position: multiply(%s, %s) stays two operands nothing can prove equal.
    assert [i.opcode for i in callee] == ["parameter", "parameter", "multiply"]
    assert callee.root.operands == tuple(p.name for p in callee.parameters)


def test_a_pass_through_loop_element_goes_through_an_identity_call() -> None:
    module = parse_hlo_file(ROUND_TRIP / "loop_pass_through.hlo")
    sealed = SealLoopPassThrough().apply(module)
    root = sealed.module.computation("body").root
    element = sealed.module.computation("body")[root.operands[1]]
    identity = sealed.module.computation(element.attr("to_apply").names[0])
    assert sealed.num_calls == 1 and element.opcode == "call" and element.operands == ("w2",)
    assert identity.root.opcode == "parameter"
