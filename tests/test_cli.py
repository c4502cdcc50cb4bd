"""The command line: `spmd-planner parse` on the bundled dump and on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import CORPUS

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_console_script_summarises_the_bundled_dump() -> None:
    result = run(str(BIN / "spmd-planner"), "parse")
    assert result.returncode == 0, result.stderr
    assert "module SyncTensorsGraph.2649: 267,437 bytes of text" in result.stdout
    assert "while.953 in scan.910: body Body.541, condition Condition.865, 8 trips" in result.stdout


def test_module_entry_point_prints_json() -> None:
    path = CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo"
    result = run(sys.executable, "-m", "planner", "parse", str(path), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["name"] == "jit_train_step"
    assert summary["num_partitions"] == 8
    assert [loop["trip_count"] for loop in summary["while_loops"]] == [8, 8]
    assert summary["opcode_counts"]["while"] == 2
    assert summary["text_bytes"] == path.stat().st_size


def test_parse_error_exits_2_with_location(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\n\nENTRY e {\n  ROOT a = f32[4] add(p, q)\n}\n")
    result = run(sys.executable, "-m", "planner", "parse", str(bad))
    assert result.returncode == 2
    assert f"{bad}:4:23: operand 'p' of 'a' is not defined" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = run(sys.executable, "-m", "planner", "parse", str(tmp_path / "nope.hlo"))
    assert result.returncode == 2
    assert "cannot read" in result.stderr and "No such file" in result.stderr


def test_gzip_and_binary_input(tmp_path: Path) -> None:
    import gzip

    packed = tmp_path / "step.hlo.gz"
    packed.write_bytes(gzip.compress((CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_bytes()))
    assert run(sys.executable, "-m", "planner", "parse", str(packed)).returncode == 0
    binary = tmp_path / "noise.hlo"
    binary.write_bytes(b"HloModule m\n\xff\xfe\n")
    result = run(sys.executable, "-m", "planner", "parse", str(binary))
    assert result.returncode == 2 and "not UTF-8" in result.stderr


def test_a_cut_short_or_corrupt_gzip_is_a_located_error(tmp_path: Path) -> None:
    import gzip

    packed = gzip.compress((CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_bytes())
    short, corrupt = tmp_path / "short.hlo.gz", tmp_path / "corrupt.hlo.gz"
    short.write_bytes(packed[: len(packed) // 2])
    corrupt.write_bytes(packed[:10] + bytes(b ^ 0x5A for b in packed[10:200]) + packed[200:])
    for path, message in (
        (short, "gzip file ends before its end-of-stream marker"),
        (corrupt, "gzip file does not decompress"),
    ):
        for command in ("parse", "plan", "memory"):
            result = run(sys.executable, "-m", "planner", command, str(path))
            assert result.returncode == 2 and f"{path}:1:1: {message}" in result.stderr, result.stderr
            assert "Traceback" not in result.stderr


def test_deep_nesting_is_a_located_error_or_a_plan(tmp_path: Path) -> None:
    deep, shallow = tmp_path / "deep.hlo", tmp_path / "shallow.hlo"
    for path, depth in ((deep, 500), (shallow, 60)):
        shape = "(" * depth + "f32[]" + ")" * depth
        path.write_text(f"HloModule m\n\nENTRY e {{\n  ROOT p = {shape} parameter(0)\n}}\n")
    for command in ("parse", "plan", "memory", "propagate"):
        result = run(sys.executable, "-m", "planner", command, str(deep))
        assert result.returncode == 2 and f"{deep}:4:76: tuple shape nested more than 64 deep" in result.stderr
        # Within the bound every command answers, its recursive walks included.
        fine = run(sys.executable, "-m", "planner", command, str(shallow))
        assert fine.returncode == 0 and "Traceback" not in fine.stderr, fine.stderr


def test_capacities_and_manifests_are_refused_with_the_reason(tmp_path: Path) -> None:
    negative = run(sys.executable, "-m", "planner", "plan", "--hbm", "-32GiB")
    assert negative.returncode == 2 and "HBM per chip must be more than 0 bytes, got '-32GiB'" in negative.stderr
    bare = run(sys.executable, "-m", "planner", "plan", "--hbm", "32")
    assert bare.returncode == 2 and "'32' needs a unit: 32GiB" in bare.stderr
    binary = tmp_path / "manifest.json"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff")
    result = run(sys.executable, "-m", "planner", "plan", "--mesh", "fsdp=4,tp=2", "--manifest", str(binary))
    assert result.returncode == 2 and f"{binary}: the manifest is not UTF-8 JSON text" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_mesh_or_tiling_past_a_million_devices_is_refused_before_it_is_built(tmp_path: Path) -> None:
    step = tmp_path / "step.hlo"
    step.write_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[8] parameter(0)\n}\n")
    mesh = run(sys.executable, "-m", "planner", "plan", str(step), "--mesh", "tp=99999999999")
    assert (
        mesh.returncode == 2 and "has 99,999,999,999 devices, more than the 1,048,576 the planner reads" in mesh.stderr
    )
    tiled = tmp_path / "tiled.hlo"
    tiled.write_text(
        "HloModule m\n\nENTRY e {\n  ROOT p = f32[8] parameter(0), sharding={devices=[1000000000]<=[1000000000]}\n}\n"
    )
    result = run(sys.executable, "-m", "planner", "plan", str(tiled))
    assert (
        result.returncode == 2
        and f"{tiled}:4:51: tile assignment [1000000000] has 1,000,000,000 tiles" in result.stderr
    )


def test_a_step_past_2_63_bytes_per_chip_is_refused_with_the_reason(tmp_path: Path) -> None:
    # XLA's parser reads the shape; no buffer assignment can size it (its offsets are int64).
    step = tmp_path / "step.hlo"
    step.write_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[9223372036854775807] parameter(0)\n}\n")
    result = run(sys.executable, "-m", "planner", "plan", str(step))
    assert result.returncode == 2 and "bytes per chip, more than 2^63 - 1" in result.stderr


def test_propagate_prints_json_and_explains() -> None:
    path = CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.pass_input.hlo"
    result = run(sys.executable, "-m", "planner", "propagate", str(path), "--json")
    assert result.returncode == 0, result.stderr
    shardings = json.loads(result.stdout)
    truth = json.loads((CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.truth.json").read_text())
    assert shardings["dot.22"] == truth["xla_instruction_shardings"]["dot.22"]
    explained = run(sys.executable, "-m", "planner", "propagate", str(path), "--explain", "dot.22")
    assert explained.returncode == 0, explained.stderr
    lines = explained.stdout.splitlines()
    assert lines[0].startswith("dot.22 [dot] {devices=[2,4]0,2,4,6,1,3,5,7}")
    # The chain ends at the annotated entry parameter the weight came from.
    assert lines[-2].strip().startswith("p58.311 [parameter]") and lines[-1].strip() == "<- annotation"


def test_propagate_flags_are_checked() -> None:
    result = run(sys.executable, "-m", "planner", "propagate", "--allow-output", "maybe")
    assert result.returncode == 2 and "expected true/false flags" in result.stderr


def test_memory_report_json_and_capacity() -> None:
    result = run(sys.executable, "-m", "planner", "memory", "--mesh", "fsdp=4,tp=2", "--hbm", "512MiB", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    truth = json.loads((CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.truth.json").read_text())
    kinds = truth["xla_allocation_bytes_by_kind"]
    assert report["argument_bytes"] == kinds["parameter"]
    assert report["output_bytes"] == kinds["maybe-live-out"] + kinds["output"]
    assert report["over_capacity"] == list(range(8))  # about 650 MiB per chip does not fit in 512 MiB
    assert report["headroom_bytes"] < 0
    assert report["top_buffers"][0]["category"] == "loop-carried"


def test_memory_rejects_bad_mesh_and_chip() -> None:
    wrong = run(sys.executable, "-m", "planner", "memory", "--mesh", "x=4")
    assert wrong.returncode == 2 and "has 4 devices but the module has num_partitions=8" in wrong.stderr
    chip = run(sys.executable, "-m", "planner", "memory", "--chip", "v9")
    assert chip.returncode == 2 and "unknown chip 'v9'" in chip.stderr


def test_plan_command_reports_and_writes_the_patched_module(tmp_path: Path) -> None:
    # XLA:CPU's plan (torch_xla's own CPU run of the step): the stacked gradients lose fsdp.
    out = tmp_path / "patched.hlo"
    result = run(
        str(BIN / "spmd-planner"), "plan", "--mesh", "fsdp=4,tp=2", "--hbm", "32GiB", "--write-patched", str(out)
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert (
        "[stacked-gradient] while.2384[38] f32[8,1024,4096] -> [8,512,4096] per chip: 64.0 MiB, ideal 16.0 MiB (4.0x)"
        in text
    )
    assert (
        "root cause: dot.1660 (dot) drops fsdp: transpose.1659[1024_tp, 256_fsdp] . multiply.1658[256_fsdp, 4096_tp]"
        in text
    )
    assert "group 1: 8 members want 4 different shardings" in text
    # Each placement in torch_xla's terms (the dump names no parameter: its shape and place say which, and no
    # line is printed for a weight it cannot name), the HLO form as detail.
    assert (
        "[in the change set] pin the [1024,4096] parameter at while.953[8] and its gradient to ('fsdp', 'tp') "
        "in the scanned layer" in text
    )
    assert "torch_xla:" not in text and "<the weight>" not in text
    assert "no torch_xla line: the dump names no parameter: plan the step through scan_runtime's client" in text
    assert "hlo: pin while.953[8] and its gradient" in text
    # The verdict comes first: fits or not, before and after, and the one change set.
    assert text.splitlines()[1:3] == [
        "  verdict: fits: 520.8 MiB per chip after the plan, 31.5 GiB to spare on 32.0 GiB; before 659.8 MiB",
        "  recommended: pin every scanned parameter and its gradient (9 pins); saves 139.0 MiB per chip (worst chip)",
    ]
    assert "    all 8 chips: 659.8 MiB -> 520.8 MiB" in text
    # The patched module parses, and carries one Sharding per recommended annotation.
    from planner import parse_hlo_file

    patched = parse_hlo_file(out)
    pinned = [i for c in patched.computations for i in c if i.name.endswith(".pinned")]
    assert len(pinned) == 18  # 9 scanned parameters: one slice pin forward, one gradient pin backward


def test_plan_command_json_and_manifest_errors(tmp_path: Path) -> None:
    path = CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo"
    result = run(sys.executable, "-m", "planner", "plan", str(path), "--mesh", "fsdp=4,tp=2", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["hbm"]["total_after"] < plan["hbm"]["total_before"]
    assert {f["kind"] for f in plan["findings"]} >= {"stacked-gradient"}
    manifest = tmp_path / "m.json"
    manifest.write_text('{"outputs": [null], "parameters": [{"name": "w", "shape": [2], "partition_spec": 3}]}')
    bad = run(sys.executable, "-m", "planner", "plan", str(path), "--mesh", "fsdp=4,tp=2", "--manifest", str(manifest))
    assert bad.returncode == 2
    assert "manifest field parameters.0.partition_spec" in bad.stderr and "Traceback" not in bad.stderr
    wrong_mesh = run(sys.executable, "-m", "planner", "plan", str(path), "--mesh", "fsdp=2,tp=2")
    assert wrong_mesh.returncode == 2 and "has 4 devices but the module has num_partitions=8" in wrong_mesh.stderr
