"""The command line behaves in pipes and with sloppy input: stdin, units, early readers, unwritable paths."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from planner.data import DEFAULT_DUMP

SPMD_PLANNER = str(Path(sys.executable).parent / "spmd-planner")


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([SPMD_PLANNER, *args], input=stdin, capture_output=True, timeout=300)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("command", ["parse", "propagate", "memory"])
def test_dash_reads_the_module_from_stdin(command: str, compress: bool) -> None:
    text = DEFAULT_DUMP.read_bytes()
    from_stdin = run(command, "-", stdin=gzip.compress(text) if compress else text)
    from_file = run(command, str(DEFAULT_DUMP))
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == from_file.stdout.replace(str(DEFAULT_DUMP).encode(), b"<stdin>")


def test_stdin_parse_errors_name_stdin() -> None:
    bad = b"HloModule m\n\nENTRY e {\n  ROOT a = f32[4] add(p, q)\n}\n"
    result = run("parse", "-", stdin=bad)
    assert result.returncode == 2
    assert result.stderr.decode().startswith("spmd-planner: <stdin>:4:23: operand 'p' of 'a' is not defined")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--hbm", "32", "argument --hbm: '32' needs a unit: 32GiB, 32GB, 32MiB or 32B"),
        ("--hbm", "0.5", "argument --hbm: '0.5' needs a unit: 0.5GiB, 0.5GB, 0.5MiB or 0.5B"),
        ("--min-bytes", "4096", "argument --min-bytes: '4096' needs a unit: 4096GiB, 4096GB, 4096MiB or 4096B"),
    ],
    ids=["hbm", "hbm_fraction", "min_bytes"],
)
def test_byte_options_need_a_unit(option: str, value: str, message: str) -> None:
    result = run("plan", "--mesh", "fsdp=4,tp=2", option, value)
    assert result.returncode == 2 and message in result.stderr.decode()


def test_byte_options_take_units_and_a_bare_zero() -> None:
    assert run("plan", "--mesh", "fsdp=4,tp=2", "--hbm", "32GiB", "--min-bytes", "0").returncode == 0


def test_an_early_reader_gets_no_error() -> None:
    """`plan | head -1`: the planner stops quietly when the pipe closes, every time."""
    for _ in range(5):
        done = subprocess.run(f"{SPMD_PLANNER} plan --mesh fsdp=4,tp=2 | head -1; exit ${{PIPESTATUS[0]}}",
                              shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout == "plan for SyncTensorsGraph.2649 on mesh fsdp=4,tp=2\n"


def test_write_patched_says_what_it_wrote_and_when_it_cannot(tmp_path: Path) -> None:
    out = tmp_path / "patched.hlo"
    wrote = run("plan", "--mesh", "fsdp=4,tp=2", "--write-patched", str(out))
    assert wrote.returncode == 0
    assert wrote.stderr.decode() == f"wrote the patched module (9 placements) to {out}\n"
    assert out.read_text().startswith("HloModule SyncTensorsGraph.2649")
    refused = run("plan", "--mesh", "fsdp=4,tp=2", "--write-patched", str(tmp_path / "missing" / "p.hlo"))
    assert refused.returncode == 2
    assert (
        refused.stderr.decode()
        == f"spmd-planner: cannot write {tmp_path / 'missing' / 'p.hlo'}: No such file or directory\n"
    )
