"""The release check's pieces (`make test-release`) on tiny inline inputs and a two-commit git repository."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fidelity.hlo_shardings import hlo_shardings
from fidelity.lit_files import parse_run_line, run_lines, split_chunks, textual_pipeline
from fidelity.pypi_release import release_time
from fidelity.release_diff import diff_cases, tuple_elements, while_changes
from fidelity.shardy_source import TEST_ROOT, lit_files, open_source

LIT = """\
// RUN: sdy_opt %s -split-input-file -sdy-add-data-flow-edges \\
// RUN:   -sdy-aggressive-propagate="propagation-strategy=basic" -sdy-sink-data-flow-edges 2>&1 | FileCheck %s
sdy.mesh @mesh = <["a"=2]>

// CHECK-LABEL: func @first
func.func @first(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

// -----
sdy.mesh @mesh = <["a"=2]>
func.func @second(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}
"""


def test_run_line_continues_and_becomes_passes() -> None:
    (run,) = run_lines(LIT)
    assert run.passes == (
        "sdy-add-data-flow-edges",
        "sdy-aggressive-propagate{propagation-strategy=basic}",
        "sdy-sink-data-flow-edges",
    )
    assert run.split_input and run.filecheck and not run.verify_diagnostics


@pytest.mark.parametrize(
    ("command", "passes", "filecheck"),
    [
        pytest.param("sdy_opt %s -sdy-basic-propagate='keep-sharding-rules=true' 2>&1 | FileCheck %s",
                     ("sdy-basic-propagate{keep-sharding-rules=true}",), True, id="quoted_option"),
        pytest.param("sdy_opt %s -sdy-populate-op-sharding-rules -verify-diagnostics",
                     ("sdy-populate-op-sharding-rules",), False, id="no_filecheck"),
        pytest.param('sdy_opt %s -sdy-x="a=1 b=2"', ("sdy-x{a=1 b=2}",), False, id="two_options"),
    ],
)  # fmt: skip
def test_parse_run_line(command: str, passes: tuple[str, ...], filecheck: bool) -> None:
    run = parse_run_line(command)
    assert (run.passes, run.filecheck) == (passes, filecheck)


def test_run_line_without_a_pass_is_refused() -> None:
    with pytest.raises(ValueError, match="runs no pass"):
        parse_run_line("sdy_opt %s -split-input-file | FileCheck %s")


def test_chunks_keep_their_lines_in_the_file() -> None:
    first, second = split_chunks(LIT, split_input=True)
    assert (first.first_line, second.first_line) == (1, 11)
    assert second.text.startswith("sdy.mesh") and "// -----" not in first.text + second.text
    # A line MLIR reports as line 1 of the chunk is the file's line `1 + line_offset`.
    assert LIT.splitlines()[second.line_offset] == second.text.splitlines()[0]
    assert split_chunks(LIT, split_input=False)[0].text == LIT


def test_function_passes_nest_like_the_command_line() -> None:
    anchors = {"sdy-sink-data-flow-edges": "func.func", "sdy-b": "func.func"}
    passes = ("sdy-add-data-flow-edges", "sdy-sink-data-flow-edges{x=1}", "sdy-b")
    assert textual_pipeline(passes, anchors) == (
        "builtin.module(sdy-add-data-flow-edges,func.func(sdy-sink-data-flow-edges{x=1},sdy-b))"
    )


HLO = """\
HloModule main, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

callee.1 {
  l9c2.1 = f32[8]{0} parameter(0), sharding={replicated}, metadata={op_name="l9c2"}
  ROOT l9c3.1 = f32[8]{0} negate(l9c2.1), sharding={replicated}, metadata={op_name="l9c3"}
}

ENTRY main.2 {
  l1c5.1 = f32[8]{0} parameter(0), sharding={devices=[2]<=[2]}, metadata={op_name="l1c5"}
  l2c8.1 = f32[8]{0} add(l1c5.1, l1c5.1), sharding={devices=[2,2]<=[4] last_tile_dims={unreduced} metadata={op_type="sdy::reduction_op" op_name="SUM"}}, metadata={op_name="l2c8"}
  l2c8.2 = f32[8]{0} copy(l2c8.1), metadata={op_name="l2c8"}
  ROOT l3c8.1 = f32[8]{0} call(l2c8.2), to_apply=callee.1, sharding={devices=[2]<=[2]}, metadata={op_name="l3c8"}
}
"""


def test_hlo_shardings_by_location() -> None:
    assert hlo_shardings(HLO) == {
        "l9c2": "{replicated}",
        "l9c3": "{replicated}",
        "l1c5": "{devices=[2]<=[2]}",
        "@param:0": "{devices=[2]<=[2]}",
        "l2c8": "{devices=[2,2]<=[4] last_tile_dims={unreduced}}",
        "l3c8": "{devices=[2]<=[2]}",
        "@root": "{devices=[2]<=[2]}",
    }


def test_release_time_is_the_earliest_upload() -> None:
    listing = {"files": [
        {"filename": "jaxlib-0.12.1-cp312-manylinux.whl", "upload-time": "2026-11-18T13:59:00Z"},
        {"filename": "jaxlib-0.12.1-cp313-macosx.whl", "upload-time": "2026-11-18T13:58:54.123Z"},
        {"filename": "jaxlib-0.12.10-cp312-manylinux.whl", "upload-time": "2026-12-01T00:00:00Z"},
    ]}  # fmt: skip
    assert release_time(listing, "jaxlib", "0.12.1") == datetime(2026, 11, 18, 13, 58, 54, 123000, tzinfo=UTC)
    with pytest.raises(ValueError, match="no upload time"):
        release_time(listing, "jaxlib", "0.13.0")


def test_case_diff_names_what_changed() -> None:
    pinned: list[dict[str, Any]] = [
        {"name": "a", "filecheck": "pass", "expect": {"l1c1": "x"}},
        {"name": "b", "filecheck": "pass", "expect_hlo_error": "RET_CHECK (hlo_sharding.cc:819) bad"},
        {"name": "gone", "filecheck": "pass"},
    ]
    fresh: list[dict[str, Any]] = [
        {"name": "a", "filecheck": "fail", "expect": {"l1c1": "y"}},
        {"name": "b", "filecheck": "pass", "expect_hlo_error": "RET_CHECK (hlo_sharding.cc:1005) bad"},
        {"name": "held_back_or_new", "filecheck": "pass"},
    ]
    diff = diff_cases(pinned, fresh)
    assert [(c.name, c.what) for c in diff.changes] == [("a", "filecheck"), ("gone", "removed"), ("a", "values")]
    assert (diff.num_common, diff.num_new_only) == (2, 1)


def test_while_shapes_compare_by_shape_not_name() -> None:
    old = {"post_partition_while_shapes": [{"name": "while.3", "shape": "(s32[], f32[4])"}]}
    renamed = {"post_partition_while_shapes": [{"name": "while.7", "shape": "(s32[], f32[4])"}]}
    grown = {"post_partition_while_shapes": [{"name": "while.3", "shape": "(s32[], f32[8])"}]}
    moved = {"post_partition_while_shapes": [{"name": "while.3", "shape": "(f32[4]{0}, /*index=1*/s32[])"}]}
    assert while_changes(old, renamed) == []
    assert while_changes(old, grown) == [
        "XLA:CPU after partitioning: loop 0: 2 -> 2 elements; only pinned: f32[4]; only newest: f32[8]"
    ]
    assert while_changes(old, moved) == ["XLA:CPU after partitioning: loop 0: 2 -> 2 elements, the same ones reordered"]
    doubled = {"post_partition_while_shapes": [{"shape": "(s32[], f32[8], f32[8]{0})"}]}
    assert while_changes(old, doubled) == [
        "XLA:CPU after partitioning: loop 0: 2 -> 3 elements; only pinned: f32[4]; only newest: f32[8] x2"
    ]


def test_tuple_elements_drop_layouts_and_index_comments() -> None:
    shape = "(s32[], bf16[4,512]{1,0}, /*index=2*/(f32[2]{0}, pred[]))"
    assert tuple_elements(shape) == ["s32[]", "bf16[4,512]", "(f32[2]{0}, pred[])"]


def _commit(repo: Path, text: str, when: str) -> None:
    test = repo / TEST_ROOT / "test" / "a.mlir"
    test.parent.mkdir(parents=True, exist_ok=True)
    test.write_text(text)
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", when]):
        subprocess.run(["git", "-C", str(repo), *args], env=env, check=True)


def test_shardy_copy_is_read_at_the_newest_commit_before_the_release(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _commit(tmp_path, "// old\n", "2026-08-01T00:00:00+00:00")
    _commit(tmp_path, "// new\n", "2026-12-01T00:00:00+00:00")
    source = open_source(tmp_path, datetime(2026, 11, 18, tzinfo=UTC))
    assert source.commit_time == datetime(2026, 8, 1, tzinfo=UTC)
    assert lit_files(source) == [(f"{TEST_ROOT}/test/a.mlir", "// old\n")]
    assert lit_files(open_source(tmp_path, None)) == [(f"{TEST_ROOT}/test/a.mlir", "// new\n")]
