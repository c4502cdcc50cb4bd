"""A loop that runs once and was kept only for a shard_map's edges is gone after partitioning
(`planner.memory.loops_run_once`): its body inlined, and what the inlining made alike merged where it is
split alike. On DeepSeek-V2's Shardy step that is the module XLA:TPU sizes: the same peak as the GSPMD
compile of the same step, where the loops went before propagation."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import REPO

from planner import parse_hlo
from planner.memory.loops_run_once import remove_loops_run_once
from planner.prepare import prepare
from planner.propagation import propagate
from planner.propagation.shared.result import PropagatedInstruction, PropagationResult
from planner.sharding.text import parse_sharding

MAXTEXT_0_0_52 = REPO / "tests" / "fixtures" / "maxtext" / "libtpu_0_0_52"


def _step(trips: int, edge: str = "xla.sdy.GlobalToLocalShape") -> str:
    """A loop of `trips` trips whose body converts the carried weight through `edge` (side-effecting), and
    the entry converting the same weight again."""
    return f"""HloModule step

body {{
  state = (s32[], f32[64,64]) parameter(0)
  i = s32[] get-tuple-element(state), index=0
  w = f32[64,64] get-tuple-element(state), index=1
  local = f32[64,64] custom-call(w), custom_call_target="{edge}", custom_call_has_side_effect=true
  in_loop = bf16[64,64] convert(w)
  one = s32[] constant(1)
  next = s32[] add(i, one)
  ROOT out = (s32[], f32[64,64], bf16[64,64]) tuple(next, local, in_loop)
}}

cond {{
  cstate = (s32[], f32[64,64]) parameter(0)
  ci = s32[] get-tuple-element(cstate), index=0
  trips = s32[] constant({trips})
  ROOT more = pred[] compare(ci, trips), direction=LT
}}

ENTRY main {{
  p = f32[64,64] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[64,64]) tuple(zero, p)
  loop = (s32[], f32[64,64], bf16[64,64]) while(init), condition=cond, body=body
  again = bf16[64,64] convert(p)
  in_loop_result = bf16[64,64] get-tuple-element(loop), index=2
  ROOT both = (bf16[64,64], bf16[64,64]) tuple(in_loop_result, again)
}}
"""


def _result(shardings: dict[str, str]) -> PropagationResult:
    return PropagationResult(
        tuple(
            PropagatedInstruction(name, "", "convert", parse_sharding(text), None, None)
            for name, text in shardings.items()
        ),
        {},
    )


def _opcodes(module) -> list[str]:  # type: ignore[no-untyped-def]
    return [i.opcode for c in module.computations for i in c]


@pytest.mark.parametrize("edge", ["xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape", "Sharding"])
def test_a_loop_run_once_behind_a_shard_map_edge_is_inlined_and_its_read_merged(edge: str) -> None:
    module = parse_hlo(_step(1, edge))
    simplified = remove_loops_run_once(module, _result({}))
    assert "while" not in _opcodes(simplified)
    entry = simplified.computation(simplified.entry_name)
    root = entry[entry.root_name]
    # The body's convert of the carried weight and the entry's convert of the parameter are one value.
    assert root.operands[0] == root.operands[1]
    assert _opcodes(simplified).count("convert") == 1


def test_reads_split_unlike_stay_two() -> None:
    module = parse_hlo(_step(1))
    result = _result({"in_loop": "{devices=[2,1]0,1}", "again": "{replicated}"})
    simplified = remove_loops_run_once(module, result)
    assert "while" not in _opcodes(simplified)
    assert _opcodes(simplified).count("convert") == 2


@pytest.mark.parametrize(
    "text",
    [
        _step(2),  # runs twice
        _step(1, edge="SomeEffect"),  # a side effect the partitioner does not remove
    ],
    ids=["two trips", "another side effect"],
)
def test_other_loops_stay(text: str) -> None:
    module = parse_hlo(text)
    assert remove_loops_run_once(module, _result({})) is module


def _peak(name: str, form: str = "hlo") -> tuple[int, int]:
    from planner.memory.estimation import estimate_memory

    record = json.loads((MAXTEXT_0_0_52 / f"{name}.xla.json").read_text())
    text = gzip.decompress((MAXTEXT_0_0_52 / f"{name}.{form}.gz").read_bytes()).decode()
    prepared = prepare(parse_hlo(text), "v6e", libtpu=record["libtpu"])
    estimate = estimate_memory(prepared, propagate(prepared))
    return estimate.temp_bytes, record["tpu"]["hbm_bytes"]


@pytest.mark.parametrize("form", ["hlo", "xla_dump.hlo"])
def test_deepseek_shardy_step_holds_what_its_gspmd_twin_holds(form: str) -> None:
    """XLA:TPU allocates 2.78 GiB for the Shardy compile and 2.80 GiB for the GSPMD one. The GSPMD module's
    one-layer scans go before propagation; the Shardy module's, held by their shard_map edges, after
    partitioning. Sized as XLA:TPU sizes them, the two peaks are the same buffers: the forward layer's
    expert weights (3 x 352 MiB) held into the backward, beside the gathered output embedding. XLA's own dump
    of the Shardy module writes the shard_map's in-shardings as side-effecting `Sharding` calls: the same."""
    shardy, shardy_xla = _peak("maxtext_deepseek2-16b_L2_v6e-16_shardy", form)
    gspmd, gspmd_xla = _peak("maxtext_deepseek2-16b_L2_v6e-16_gspmd")
    assert abs(shardy_xla - gspmd_xla) / gspmd_xla < 0.01
    assert abs(shardy - gspmd) / gspmd < 0.001
