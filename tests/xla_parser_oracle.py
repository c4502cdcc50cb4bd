"""XLA's own HLO parser (jaxlib 0.7.1), in a worker process that may die.

jaxlib aborts the whole process (a CHECK failure) on some invalid inputs, so
the parser runs in a child process fed one text at a time over a pipe. A
child that dies, or runs past its time bound, is restarted; that input
counts as rejected by XLA, with the reason recorded.

    with XlaParser() as xla:
        verdict = xla.parse("HloModule m\\nENTRY e { ROOT p = f32[] parameter(0) }")
        verdict.accepted, verdict.text  # XLA's printout of the module
        verdict.error                   # or why XLA refused it
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

# The child: read a length-prefixed text, answer one JSON line. Importing
# jaxlib._jax alone (not jax) keeps a restart near 0.15 s.
_WORKER = r"""
import json, struct, sys
import jaxlib._jax as xla
inp, out = sys.stdin.buffer, sys.stdout
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    text = inp.read(struct.unpack("<I", head)[0]).decode()
    try:
        answer = {"accepted": True, "text": xla.hlo_module_from_text(text).to_string()}
    except Exception as e:
        answer = {"accepted": False, "error": str(e)}
    out.write(json.dumps(answer) + "\n")
    out.flush()
"""


@dataclass(frozen=True, slots=True)
class XlaVerdict:
    accepted: bool
    text: str = ""  # the module as XLA prints it, when accepted
    error: str = ""  # XLA's message, "crashed: ..." or "timed out", when not

    @property
    def crashed(self) -> bool:
        return self.error.startswith(("crashed", "timed out"))


class XlaParser:
    """A persistent child running `hlo_module_from_text`; restarted when it dies."""

    def __init__(self, seconds_per_input: float = 20.0) -> None:
        self.seconds_per_input = seconds_per_input
        self.num_restarts = 0
        self._child: subprocess.Popen[bytes] | None = None
        # The child's stderr goes to a file: a pipe nobody reads could fill and stall it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the parser; closed in close()

    def __enter__(self) -> XlaParser:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None
        self._stderr.close()

    def _start(self) -> subprocess.Popen[bytes]:
        self._stderr.seek(0)
        self._stderr.truncate()
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
        self._child = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            cwd=Path(__file__).parent,
        )
        return self._child

    def parse(self, text: str) -> XlaVerdict:
        verdict = self._parse_once(text)
        if verdict.crashed:
            # An earlier input can corrupt the child's heap (XLA copies an over-long sharding device list past
            # its array) and a later, valid one crash on it: only a crash in a fresh child counts.
            verdict = self._parse_once(text)
        return verdict

    def _parse_once(self, text: str) -> XlaVerdict:
        child = self._child if self._child is not None and self._child.poll() is None else self._start()
        data = text.encode()
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(struct.pack("<I", len(data)) + data)
            child.stdin.flush()
        except BrokenPipeError:
            return self._died("crashed before reading the input")
        ready, _, _ = select.select([child.stdout], [], [], self.seconds_per_input)
        if not ready:
            return self._died("timed out")
        line = child.stdout.readline()
        if not line:
            return self._died("crashed")
        answer = json.loads(line)
        return XlaVerdict(answer["accepted"], answer.get("text", ""), answer.get("error", ""))

    def _died(self, why: str) -> XlaVerdict:
        child = self._child
        assert child is not None
        child.kill()
        child.wait()
        # The last line of a CHECK failure names the check.
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
        self._child = None
        self.num_restarts += 1
        return XlaVerdict(False, error=f"{why}: {tail[0][:300]}" if why != "timed out" else why)
