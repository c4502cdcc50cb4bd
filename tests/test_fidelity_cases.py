"""The reference cases and what their records hold: steps checked on construction, names that stay put,
dumps restricted to the passes the records read, XLA's decisions per compiler and per pass.

The first tests need no compiler. Those marked `xla` read the CI subset's references (generated on
first use, cached by content, as `test_fidelity_subset` does).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from fidelity.cases import ACCUMULATION_CASES, CASES, CI_SUBSET, Case, MeshSpec, ModelSize, grid, lm_grid
from fidelity.dumps import DUMP_PASS_RE, DUMP_PIPELINE_RE, ModuleDump, xla_flags
from fidelity.hlo_text import parse_instruction, read_module, source_names
from fidelity.references import ensure_references, reference_path

# sha256 of the sorted (name, config) of the 136 cases that existed before whole steps joined the grid:
# their names and configs key cached references and results tables, so they must not move. (It moved
# once, on purpose: the 12 torch_xla cases among them are also compiled for XLA:TPU, tpu_topology v6e:2x4.)
TOY_CASES_FINGERPRINT = "a356a41c5e86b1384e5db9597d569c6a52e90a91dc9258a7ffb19012837b9535"
LM = ModelSize(4, 1024, 2816, 8, 2, 128, 8, 512, vocab_size=8192)
LEAF = re.compile(r"[a-z][a-z0-9]*\[[0-9,]*\]")


def lm_case(**changes: object) -> Case:
    fields: dict[str, object] = {"name": "x", "front_end": "jax", "partitioner": "gspmd", "remat": None, "size": LM,
                                 "step": "lm", "cross_entropy": "take_along_axis"}  # fmt: skip
    return Case(**(fields | changes))  # type: ignore[arg-type]


def test_the_toy_cases_keep_their_names_and_configs() -> None:
    toy = [[c.name, c.config()] for c in CASES if c.step == "toy" and c.microbatches == 1]
    text = json.dumps(sorted(json.loads(json.dumps(toy))), sort_keys=True)
    assert len(toy) == 136
    assert hashlib.sha256(text.encode()).hexdigest() == TOY_CASES_FINGERPRINT
    assert all("step" not in config for _, config in toy)


def test_accumulation_cases_come_free_and_pinned_and_record_their_microbatches() -> None:
    by_name = {c.name: c for c in ACCUMULATION_CASES}
    assert len(by_name) == len(ACCUMULATION_CASES) == 6
    for case in ACCUMULATION_CASES:
        assert case.microbatches > 1 and f"_accum{case.microbatches}_" in case.name
        assert case.config()["microbatches"] == case.microbatches
        twin = (
            case.name.removesuffix("_free") + "_pinned"
            if not case.pinned
            else case.name.removesuffix("_pinned") + "_free"
        )
        assert by_name[twin].pinned != case.pinned and replace(by_name[twin], name="", pinned=False) == replace(
            case, name="", pinned=False
        )
    with pytest.raises(ValueError, match="does not split into 3 microbatches"):
        Case("x", "jax", "gspmd", None, ModelSize(4, batch_size=8), MeshSpec((4, 2)), microbatches=3)


def test_case_names_are_unique_and_say_the_step() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    for case in CASES:
        if case.step != "toy":
            assert f"_{case.step.replace('_', '')}_" in case.name
            assert case.config()["step"] == case.step and case.config()["V"] == case.size.vocab_size


def test_whole_steps_span_every_new_dimension() -> None:
    steps = lm_grid()
    assert set(steps) <= set(grid())
    jax_steps = [c for c in steps if c.front_end == "jax"]
    assert {c.step for c in jax_steps} == {"lm", "lm_tied", "vit"}
    assert {c.cross_entropy for c in jax_steps} == {"take_along_axis", "one_hot"}
    assert {c.optimizer for c in jax_steps} == {None, "adamw", "adamw_clip"}
    assert {c.mixed_precision for c in jax_steps} == {None, "f32_state", "f32_master"}
    assert {c.microbatches for c in jax_steps} == {1, 2, 4}
    assert {c.partitioner for c in jax_steps} == {"gspmd", "shardy"}
    assert {c.chip for c in jax_steps} == {"v6e", "v5e", "v5p", "v4"}
    assert {c.family for c in jax_steps} == {"llama", "gpt2", "moe"}
    assert any(c.seq_parallel for c in jax_steps) and any(c.packed and c.z_loss for c in jax_steps)
    assert {c.mesh.size("expert") for c in jax_steps} == {1, 2, 4}
    assert any(c.mesh.num_devices == 256 and c.size.vocab_size == 128256 for c in jax_steps)
    torch_steps = [c for c in steps if c.front_end == "torch_xla"]
    assert {c.step for c in torch_steps} == {"lm", "lm_tied"} and {c.optimizer for c in torch_steps} == {None, "adamw"}


# fmt: off
REFUSED = [
    ({"step": "toy"}, "toy step has no loss"),
    ({"step": "chat"}, "is not one of"),
    ({"cross_entropy": None}, "needs a cross_entropy"),
    ({"cross_entropy": "focal"}, "is not one of"),
    ({"size": replace(LM, vocab_size=0)}, "needs a cross_entropy and size.vocab_size"),
    ({"size": replace(LM, vocab_size=8191)}, "does not split over tp=2"),
    ({"optimizer": "adamw"}, "pinned to their in_shardings"),
    ({"optimizer": "adamw", "pinned": True, "mixed_precision": "f32_master"}, "over bf16 params"),
    ({"mixed_precision": "f32_state", "size": replace(LM, dtype="bfloat16")}, "over bf16 params"),
    ({"microbatches": 4}, "does not split into 4 microbatches"),
    ({"microbatches": 0}, "does not split into 0 microbatches"),
    ({"seq_parallel": True, "mesh": MeshSpec((8,), ("fsdp",))}, "splits seq_len=512 over a tp axis"),
    ({"family": "mlp"}, "mlp family has no attention"),
    ({"step": "vit"}, "the ViT is the gpt2 family"),
    ({"step": "vit", "family": "gpt2", "size": replace(LM, num_kv_heads=8)}, "square grid of patches"),
    ({"mesh": MeshSpec((2, 2, 2), ("expert", "fsdp", "tp"))}, "an expert axis of 2 splits the moe family"),
    ({"front_end": "torch_xla", "chip": None, "cross_entropy": "one_hot"}, "F.cross_entropy"),
    ({"front_end": "torch_xla", "chip": None, "optimizer": "adamw_clip"}, "torch.optim.AdamW"),
]
# fmt: on


@pytest.mark.parametrize("changes,message", REFUSED, ids=[re.sub(r"\W+", "_", m).strip("_") for _, m in REFUSED])
def test_steps_are_checked_on_construction(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        lm_case(**changes)


def test_toy_steps_refuse_step_options() -> None:
    with pytest.raises(ValueError, match="toy step has no loss"):
        Case("x", "jax", "gspmd", None, ModelSize(4), optimizer="adamw")
    with pytest.raises(ValueError, match=re.escape("names an axis twice")):
        MeshSpec((2, 2), ("fsdp", "fsdp"))


def test_flags_dump_only_the_partitioning_pipelines_unless_asked() -> None:
    flags = xla_flags(Path("/d"), 8)
    assert flags.split() == [
        "--xla_force_host_platform_device_count=8",
        "--xla_dump_to=/d",
        "--xla_dump_hlo_as_text",
        f"--xla_dump_hlo_pass_re={DUMP_PASS_RE}",
        f"--xla_dump_hlo_pipeline_re={DUMP_PIPELINE_RE}",
    ]
    for name in ("spmd-partitioner", "xla-partitioner"):
        assert re.search(DUMP_PIPELINE_RE, name)
    assert not re.search(DUMP_PIPELINE_RE, "xla-partitioner-optimizations")
    for name in ("sharding-propagation", "shardy-xla", "spmd-partitioning", "tpu-spmd-partitioning"):
        assert re.search(DUMP_PASS_RE, name)
    everything = xla_flags(Path("/d"), dump_all=True, disabled_passes=("hlo-module-dce", "simplify-while-loops"))
    assert "--xla_dump_hlo_pass_re=.+" in everything and "pipeline_re" not in everything
    assert everything.endswith("--xla_disable_hlo_passes=hlo-module-dce,simplify-while-loops")


def test_boundaries_are_read_in_the_order_the_passes_ran(tmp_path: Path) -> None:
    prefix = "module_0001.jit_train_step.cl_789893895"
    for seq, pipeline, after, before in [
        (10000, "xla-partitioner", "tpu-spmd-partitioning", "convert_operand_folding"),
        (9999, "xla-partitioner", "sharding-propagation", "spmd-prepare"),
        (9997, "xla-partitioner", "sharding-propagation", "convolution-folding"),
        (9996, "xla-partitioner", "dce", "sharding-propagation"),
    ]:
        (tmp_path / f"{prefix}.{seq:04d}.{pipeline}.after_{after}.before_{before}.txt").write_text(str(seq))
    (tmp_path / "module_0003.jit_train_step.0001.spmd-partitioner.after_spmd-partitioning.before_end.txt").touch()
    module = ModuleDump(tmp_path, prefix)
    assert [b.sequence for b in module.boundaries()] == [9996, 9997, 9999, 10000]
    assert module.before_propagation.read_text() == "9996"
    assert module.after_propagation.read_text() == "9999"
    assert module.after_spmd_partitioning.read_text() == "10000"


@pytest.mark.parametrize(
    "line,name,opcode,operands,callees,sharding",
    [
        (
            "  %while.1007 = (s32[], f32[8,512]{1,0}, /*index=5*/f32[4]{0}) while(%tuple.3), condition=%cond.2, "
            "body=%body.1, sharding={{replicated}, {devices=[4,1,2]<=[8] last_tile_dim_replicate}, {manual}}",
            "while.1007",
            "while",
            ("tuple.3",),
            ("cond.2", "body.1"),
            "{{replicated}, {devices=[4,1,2]<=[8] last_tile_dim_replicate}, {manual}}",
        ),
        (
            "  ROOT %t = (f32[2]{0}, s32[]) tuple(%a, /*index=1*/%b)",
            "t",
            "tuple",
            ("a", "b"),
            (),
            None,
        ),
        (
            "  jit__where_.287 = f32[8,8]{1,0} call(div.281, Arg_5.181), to_apply=_where_49.286, "
            'metadata={op_name="jit(_where)" source_file="/m.py" source_line=156}',
            "jit__where_.287",
            "call",
            ("div.281", "Arg_5.181"),
            ("_where_49.286",),
            None,
        ),
        (
            "  %add.3 = f32[8]{0:T(128)} add(f32[8]{0:T(128)} %x, f32[8]{0:T(128)} %y), sharding={devices=[8]<=[8]}",
            "add.3",
            "add",
            ("x", "y"),
            (),
            "{devices=[8]<=[8]}",
        ),
        ("  %c = pred[] constant(false), sharding={replicated}", "c", "constant", (), (), "{replicated}"),
        ('  %p = f32[8]{0} parameter(3), metadata={op_name="a, b(c)"}', "p", "parameter", (), (), None),
    ],
    ids=["while", "tuple", "call", "typed_operands", "constant", "parameter"],
)
def test_dump_lines_read_as_xla_printed_them(
    line: str, name: str, opcode: str, operands: tuple[str, ...], callees: tuple[str, ...], sharding: str | None
) -> None:
    inst = parse_instruction(line)
    assert inst is not None
    assert (inst.name, inst.opcode, inst.operands, inst.callees, inst.sharding) == (
        name,
        opcode,
        operands,
        callees,
        sharding,
    )


def test_inlined_names_map_back_to_the_source() -> None:
    """XLA's CallInliner names clones afresh; a callee called twice maps to `name@call`."""
    source = read_module(
        "HloModule m\n\nsq.1 {\n  a.2 = f32[8]{0} parameter(0)\n  ROOT mul.3 = f32[8]{0} multiply(a.2, a.2)\n}\n\n"
        "ENTRY main.4 {\n  x.5 = f32[8]{0} parameter(0)\n  c.6 = f32[8]{0} call(x.5), to_apply=sq.1\n"
        "  c.7 = f32[8]{0} call(c.6), to_apply=sq.1\n  ROOT neg.8 = f32[8]{0} negate(c.7)\n}\n"
    )
    inlined = read_module(
        "HloModule m\n\nENTRY %main.4 (x.5: f32[8]) -> f32[8] {\n  %x.5 = f32[8]{0} parameter(0)\n"
        "  %multiply.1 = f32[8]{0} multiply(%x.5, %x.5)\n  %multiply.2 = f32[8]{0} multiply(%multiply.1, %multiply.1)\n"
        "  ROOT %neg.8 = f32[8]{0} negate(%multiply.2)\n}\n"
    )
    assert source_names(source, inlined) == {
        "neg.8": "neg.8",
        "multiply.2": "mul.3@c.7",
        "multiply.1": "mul.3@c.6",
        "x.5": "x.5",
    }


def test_elided_tuple_elements_map_back_to_the_source_s_get_tuple_elements() -> None:
    """Today's XLA dump writes `%t#k` for element k of `t`; the lowered source has the get-tuple-element."""
    source = read_module(
        "HloModule m\n\nENTRY main.1 {\n  a.2 = f32[8]{0} parameter(0)\n  t.3 = (f32[8]{0}, f32[8]{0}) tuple(a.2, a.2)\n"
        "  g.4 = f32[8]{0} get-tuple-element(t.3), index=1\n  ROOT n.5 = f32[8]{0} negate(g.4)\n}\n"
    )
    dump = read_module(
        "HloModule m\n\nENTRY %main.1 (a.2: f32[8]) -> f32[8] {\n  %a.2 = f32[8]{0} parameter(0)\n"
        "  %t.3 = (f32[8]{0}, f32[8]{0}) tuple(%a.2, %a.2)\n  ROOT %n.5 = f32[8]{0} negate(%t.3#1)\n}\n"
    )
    element = dump["main.1"].instructions["t.3#1"]
    assert (element.opcode, element.operands) == ("get-tuple-element", ("t.3",))
    assert source_names(source, dump) == {"n.5": "n.5", "t.3#1": "g.4", "t.3": "t.3", "a.2": "a.2"}


# --- what the records hold (real compiles, cached) -----------------------------------------------------

JAX_CI = [c for c in CI_SUBSET if c.front_end == "jax"]


@pytest.fixture(scope="module")
def records() -> dict[str, dict[str, object]]:
    failed = ensure_references(list(CI_SUBSET), jobs=2)
    assert not failed, f"references failed to generate: {failed}"
    return {c.name: json.loads(reference_path(c).with_suffix(".xla.json").read_text()) for c in CI_SUBSET}


@pytest.mark.xla
@pytest.mark.parametrize("case", JAX_CI, ids=[c.name for c in JAX_CI])
def test_tpu_truth_is_recorded_pass_by_pass(case: Case, records: dict[str, dict]) -> None:
    record = records[case.name]
    tpu = record["tpu"]
    assert set(tpu) >= {"memory", "instruction_shardings", "post_partition_while_shapes", "output_shardings",
                        "pre_propagation_module"}  # fmt: skip
    assert len(tpu["output_shardings"]) == len(record["outputs"]) == len(record["output_shardings"])
    assert len(tpu["instruction_shardings"]) > 100
    assert all(text.startswith("{") for text in tpu["instruction_shardings"].values())
    assert tpu["post_partition_while_shapes"] and record["post_partition_while_shapes"]
    pre = reference_path(case).with_name(tpu["pre_propagation_module"])
    assert pre.read_text().startswith("HloModule ")
    # Propagation read from the last pass: GSPMD's second run on XLA:TPU, Shardy's one.
    last = "sharding-propagation.before_spmd-prepare" if case.partitioner == "gspmd" else "after_shardy-xla."
    assert last in tpu["dump_files"][1]


@pytest.mark.xla
@pytest.mark.parametrize("case", JAX_CI, ids=[c.name for c in JAX_CI])
def test_cpu_shardings_are_keyed_by_the_module_users_send(case: Case, records: dict[str, dict]) -> None:
    record = records[case.name]
    shardings = record["instruction_shardings"]
    assert len(shardings) > 100
    if case.partitioner == "shardy":
        assert record["instruction_shardings_keys"] == "xla"
        return
    assert record["instruction_shardings_keys"] == "source" and record["name_mapping"]["unmapped"] == []
    source = read_module(reference_path(case).read_text())
    names = {name for comp in source.values() for name in comp.instructions}
    # Every key is an instruction of NAME.hlo, or a clone of one under the planner's path notation.
    assert all(key.split("@")[0] in names for key in shardings)


@pytest.mark.xla
@pytest.mark.parametrize("case", [c for c in JAX_CI if c.step != "toy"], ids=lambda c: c.name)
def test_whole_steps_compile_to_what_they_say(case: Case, records: dict[str, dict]) -> None:
    text = reference_path(case).read_text()
    record = records[case.name]
    ops = {op: len(re.findall(rf" {op}\(", text)) for op in ("gather", "scatter", "while")}
    # The embedding is a gather (its gradient a scatter); take_along_axis is one more of each.
    assert ops["gather"] == ops["scatter"] == (2 if case.cross_entropy == "take_along_axis" else 1)
    assert ops["while"] == (3 if case.microbatches > 1 else 2)
    assert record["params"]["batch['tokens']"]["dtype"] == "int32"
    assert record["params"]["batch['tokens']"]["shape"] == [case.size.batch_size, case.size.seq_len + 1]
    assert ("embed" in record["analysis"]["param_shard_shapes"]) and (
        ("head" in record["analysis"]["param_shard_shapes"]) == (case.step == "lm")
    )
    if case.optimizer:
        # Params and state donated: XLA aliases them to the outputs, which keep their input shardings.
        assert record["memory"]["alias_size_in_bytes"] > 0
        assert record["outputs"][-1] == "loss" and "opt_state['count']" in record["outputs"]
        assert "input_output_alias" in text.split("\n", 1)[0]
    tpu_loops = [len(LEAF.findall(w["shape"])) for w in record["tpu"]["post_partition_while_shapes"]]
    assert tpu_loops and all(n > 0 for n in tpu_loops)
