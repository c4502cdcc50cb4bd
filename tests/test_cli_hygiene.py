"""The command line behaves in pipes and with sloppy input: stdin, units, early readers, unwritable paths."""

from __future__ import annotations

import errno
import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli import main
from planner.data import DEFAULT_DUMP

SPMD_PLANNER = str(Path(sys.executable).parent / "spmd-planner")
# As a user's shell runs it: with PYTHONUNBUFFERED set (CI sets it) output is written as it is printed,
# which hides what a buffered stdout does when the reader has gone.
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([SPMD_PLANNER, *args], input=stdin, capture_output=True, timeout=300, env=USER_ENV)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize(
    "command", [("parse",), ("propagate",), ("memory",), ("plan", "--mesh", "fsdp=4,tp=2")], ids=lambda c: c[0]
)
def test_dash_reads_the_module_from_stdin(command: tuple[str, ...], compress: bool) -> None:
    text = DEFAULT_DUMP.read_bytes()
    from_stdin = run(command[0], "-", *command[1:], stdin=gzip.compress(text) if compress else text)
    from_file = run(command[0], str(DEFAULT_DUMP), *command[1:])
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
        ("--hbm", "1e9", "argument --hbm: bad byte count '1e9': expected a number and a unit, e.g. 32GiB or 80GB"),
        ("--hbm", "0", "argument --hbm: HBM per chip must be more than 0 bytes, got '0'"),
        ("--hbm", "0GiB", "argument --hbm: HBM per chip must be more than 0 bytes, got '0GiB'"),
    ],
    ids=["hbm", "hbm_fraction", "min_bytes", "hbm_malformed", "hbm_zero", "hbm_zero_with_unit"],
)
def test_byte_options_need_a_unit(option: str, value: str, message: str) -> None:
    result = run("plan", "--mesh", "fsdp=4,tp=2", option, value)
    assert result.returncode == 2 and message in result.stderr.decode()


def test_byte_options_take_units_and_a_bare_zero() -> None:
    assert run("plan", "--mesh", "fsdp=4,tp=2", "--hbm", "32GiB", "--min-bytes", "0").returncode == 0


@pytest.mark.parametrize(
    ("pipeline", "shown"),
    [
        # A long report: the pipe closes while the planner is still writing.
        ("plan --mesh fsdp=4,tp=2 | head -1", "plan for SyncTensorsGraph.2649 on mesh fsdp=4,tp=2\n"),
        # A short one, still in stdout's buffer when the reader (which reads nothing) has gone.
        ("parse | head -n 0", ""),
    ],
    ids=["long_output", "buffered_output"],
)
def test_an_early_reader_gets_no_error(pipeline: str, shown: str) -> None:
    """`plan | head -1`: the planner stops quietly when the pipe closes, every time."""
    for _ in range(5):
        done = subprocess.run(f"{SPMD_PLANNER} {pipeline}; exit ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash",
                              capture_output=True, text=True, timeout=300, env=USER_ENV)  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout == shown


def test_an_error_without_a_file_is_not_called_a_read_of_none(monkeypatch, capsys) -> None:
    def fails(args: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("cli.parse_command.run", fails)
    assert main(["parse"]) == 2
    assert capsys.readouterr().err == "spmd-planner: Input/output error\n"


@pytest.mark.parametrize("command", ["plan", "memory"])
def test_a_swapped_mesh_is_warned_about_on_stderr(command: str) -> None:
    swapped = run(command, "--mesh", "tp=2,fsdp=4")
    assert swapped.returncode == 0
    assert swapped.stderr.decode() == (
        "spmd-planner: warning: mesh tp=2,fsdp=4 does not fit the module's parameter shardings; "
        "fsdp=4,tp=2 or tp=4,fsdp=2 would: check the axis order (major to minor) and sizes\n"
    )
    right = run(command, "--mesh", "fsdp=4,tp=2")
    assert right.returncode == 0 and right.stderr == b""


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
