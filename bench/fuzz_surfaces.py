"""Generated bad (and good) input through the command line and the service: a located error or a plan, never
a traceback, never a 5xx.

Inputs are made from real modules (XLA's propagation test cases, the golden files, a torch_xla scan step,
a JAX StableHLO lowering) by what broken input looks like: truncated and swapped tokens, deleted braces,
wrong operand counts, cycles, unicode and control characters, gzip whole, cut short and corrupt, nesting
far past any real module, names repeated across computations, dims and counts huge, zero and negative,
binary noise. Each input goes through one surface:

- the CLI, in process (`cli.main.main`, a subcommand and flags drawn at random): exit 0 or 2,
  nothing escaping, no "Traceback" printed;
- the service, over HTTP in process (FastAPI's TestClient on `create_app`), as JSON, an uploaded file or
  pasted form text with settings drawn at random. The plan job the service runs in a child process
  (`api.plan_job.plan_job`) runs in this process: a job that raised would be a child that died, a 500.
  Every answer must be below 500 with `{"detail": "<string>"}` on errors.

    python bench/fuzz_surfaces.py --inputs 10000 [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import io
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))
sys.path.insert(0, str(REPO))

SECONDS_PER_INPUT = 60
_TOKEN = re.compile(r"[%\w.\-#]+|[{}()\[\],=:'?]")


def seeds() -> list[str]:
    cases = json.loads((SHARED / "xla_cases" / "sharding_propagation_cases.json").read_text())["cases"]
    tests = REPO / "tests"
    return (
        [c["hlo"] for c in cases]
        + [p.read_text() for p in sorted((tests / "golden").glob("*.hlo"))]
        + [(tests / "fixtures" / "shardy_constraints.hlo").read_text()]
        + [(tests / "fixtures" / "repeated_names.hlo").read_text()]
        + [(tests / "fixtures" / "jax_sgd_mixed_outputs.stablehlo.mlir").read_text()]
        + [(SHARED / "corpus" / "torch_xla" / "llama_scan_L4_small.hlo").read_text()]
        # Each release's text of one step: XLA 0.12's `%t#k` operands, Shardy shardings written natively and
        # mesh-axis replica groups; StableHLO with a boolean constant in either hex layout.
        + [p.read_text() for p in sorted((tests / "fixtures").glob("jax_0_*/*.stablehlo.mlir"))]
        + [p.read_text() for p in sorted((tests / "fixtures").glob("jax_0_7_1/*.hlo"))]
        # Last: the text the mutations are checked on (tests/test_fuzz_surfaces.py).
        + [p.read_text() for p in sorted((tests / "fixtures").glob("jax_0_12/*.hlo"))]
    )


# Mutations of one text: each takes a random source and returns new text.
def truncate(r: random.Random, text: str) -> str:
    return text[: int(len(text) * r.random())]


def swap_tokens(r: random.Random, text: str) -> str:
    tokens = list(_TOKEN.finditer(text))
    if len(tokens) < 2:
        return text
    a, b = sorted(r.sample(tokens, 2), key=lambda m: m.start())
    return text[: a.start()] + b.group() + text[a.end() : b.start()] + a.group() + text[b.end() :]


def delete_char(r: random.Random, text: str) -> str:
    spots = [m.start() for m in re.finditer(r"[{}()\[\],=]", text)]
    if not spots:
        return text
    at = r.choice(spots)
    return text[:at] + text[at + 1 :]


def odd_number(r: random.Random, text: str) -> str:
    numbers = list(re.finditer(r"(?<![\w.])\d+(?![\w.])", text))
    if not numbers:
        return text
    m = r.choice(numbers)
    value = r.choice(["0", "-1", "9223372036854775807", "99999999999999999999999", "1e400", "007", "2147483648"])
    return text[: m.start()] + value + text[m.end() :]


def wrong_arity(r: random.Random, text: str) -> str:
    calls = list(
        re.finditer(r"\b(add|multiply|dot|tuple|get-tuple-element|reshape|broadcast|while)\((%?[\w.\-]+)", text)
    )
    if not calls:
        return text
    m = r.choice(calls)
    return text[: m.end()] + ", " + m.group(2) + text[m.end() :]


def cycle(r: random.Random, text: str) -> str:
    """A While's body or a call's callee pointed at the entry, which holds it."""
    entry = re.search(r"ENTRY %?([\w.\-]+)", text)
    callees = list(re.finditer(r"(?:body|condition|to_apply|calls)=%?([\w.\-]+)", text))
    if entry is None or not callees:
        return text
    m = r.choice(callees)
    return text[: m.start(1)] + entry.group(1) + text[m.end(1) :]


def repeat_name(r: random.Random, text: str) -> str:
    """An instruction renamed to another computation's instruction name (and its uses in its computation)."""
    comps = re.split(r"(?m)^(?=\S.*\{\s*$)", text)
    names = [re.findall(r"(?m)^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", c) for c in comps]
    usable = [i for i, n in enumerate(names) if n]
    if len(usable) < 2:
        return text
    i, j = r.sample(usable, 2)
    old, new = r.choice(names[i]), r.choice(names[j])
    comps[i] = re.sub(rf"(?<![\w.\-]){re.escape(old)}(?![\w.\-])", new, comps[i])
    return "".join(comps)


def control_characters(r: random.Random, text: str) -> str:
    at = r.randrange(len(text) + 1)
    return text[:at] + r.choice(["\x00", "\x1b[31m", "\r", "\x7f", "\u2028", "\ufeff", "\x85", "\t\t"]) + text[at:]


def unicode_name(r: random.Random, text: str) -> str:
    names = list(re.finditer(r"%([\w.\-]+)", text))
    if not names:
        return text
    name = r.choice(names).group(1)
    return text.replace(name, name + r.choice(["_ω·名", "\u0301", "🙂", "\u202e"]))


MUTATIONS: list[Callable[[random.Random, str], str]] = [
    truncate, swap_tokens, delete_char, odd_number, wrong_arity, cycle, repeat_name, control_characters,
    unicode_name,
]  # fmt: skip


def nested(r: random.Random) -> str:
    """Nesting where the grammar allows it, from a little to far past any real module."""
    depth = r.choice([3, 63, 64, 65, 200, 1000, 20000])
    kind = r.choice(["tuple", "sharding", "frontend", "calls", "braces"])
    if kind == "tuple":
        return f"HloModule m\n\nENTRY e {{\n  ROOT p = {'(' * depth}f32[]{')' * depth} parameter(0)\n}}\n"
    if kind == "sharding":
        sharding = "{" * depth + "replicated" + "}" * depth
        return f"HloModule m\n\nENTRY e {{\n  ROOT p = f32[4] parameter(0), sharding={sharding}\n}}\n"
    if kind == "frontend":
        attrs = "{a=" * depth + "1" + "}" * depth
        return f"HloModule m\n\nENTRY e {{\n  ROOT p = f32[] parameter(0), frontend_attributes={attrs}\n}}\n"
    if kind == "calls":
        depth = min(depth, 3000)
        comps = "".join(
            f"c{i} {{\n  x = f32[] parameter(0)\n  ROOT y = f32[] call(x), to_apply=c{i - 1}\n}}\n\n"
            for i in range(1, depth)
        )
        return (
            f"HloModule m\n\nc0 {{\n  ROOT x = f32[] parameter(0)\n}}\n\n{comps}ENTRY e {{\n  p = f32[] parameter(0)\n"
            f"  ROOT r = f32[] call(p), to_apply=c{depth - 1}\n}}\n"
        )
    return "HloModule m, frontend_attributes=" + "{" * depth + "\n"


def noise(r: random.Random) -> bytes:
    return r.choice([
        b"", b"   \n\t", b"\xef\xbb\xbfHloModule m\n", bytes(r.randrange(256) for _ in range(r.randrange(1, 400))),
        b"HloModule m\n\xff\xfe\n", b"\x1f\x8b" + bytes(r.randrange(256) for _ in range(64)),
        b"ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n", b"module {\n", b"HloModule",
    ])  # fmt: skip


@dataclass(frozen=True)
class Input:
    kind: str
    data: bytes


def generate(r: random.Random, texts: list[str]) -> Input:
    roll = r.random()
    if roll < 0.08:
        return Input("nesting", nested(r).encode())
    if roll < 0.14:
        return Input("noise", noise(r))
    # The torch_xla step is a real scan (slow to plan): one input in twenty draws it.
    text = texts[-1] if r.random() < 0.05 else r.choice(texts[:-1])
    kind = "mutated"
    for _ in range(r.choice([0, 1, 1, 2, 3])):
        text = r.choice(MUTATIONS)(r, text)
    data = text.encode("utf-8", "surrogatepass")
    if r.random() < 0.12:
        packed = gzip.compress(data)
        how = r.choice(["whole", "cut", "corrupt"])
        if how == "cut":
            packed = packed[: r.randrange(2, max(3, len(packed)))]
        elif how == "corrupt" and len(packed) > 12:
            at = r.randrange(10, len(packed))
            packed = packed[:at] + bytes([packed[at] ^ 0xA5]) + packed[at + 1 :]
        return Input(f"gzip {how}", packed)
    return Input(kind, data)


MESHES = [
    "fsdp=4,tp=2",
    "x=4,y=2",
    "fsdp=8",
    "fsdp=0",
    "a=-1",
    "fsdp=4,fsdp=2",
    "",
    "fsdp=4,tp=2,",
    "=4",
    "tp=99999999999",
]
CAPACITIES = [["--chip", "v6e"], ["--chip", "v9"], ["--hbm", "32GiB"], ["--hbm", "32"], ["--hbm", "-32GiB"],
              ["--hbm", "1e999GiB"], ["--hbm", "0"], []]  # fmt: skip


@dataclass
class Tally:
    answers: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    failed_inputs: list[bytes] = field(default_factory=list)
    seconds: float = 0.0
    slowest: float = 0.0


@contextlib.contextmanager
def time_bound(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"input ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def through_cli(r: random.Random, item: Input, workdir: Path) -> str:
    """Exit status of one CLI run, as 'exit N'; raises on a traceback."""
    from cli.main import main

    path = workdir / r.choice(["step.hlo", "step.hlo.gz", "step.mlir"])
    path.write_bytes(item.data)
    command = r.choice(["parse", "plan", "plan", "memory", "propagate"])
    argv = [command, str(path)]
    if command != "parse" and r.random() < 0.7:
        argv += ["--mesh", r.choice(MESHES)]
    if command in ("plan", "memory") and r.random() < 0.6:
        argv += r.choice(CAPACITIES)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    if "Traceback" in err.getvalue() or code not in (0, 2):
        raise AssertionError(f"{argv}: exit {code}\n{err.getvalue()[-2000:]}")
    return f"exit {code}"


class InProcessWorkers:
    """The service's workers with the plan job run in this process: a job that raises is a 500."""

    def __init__(self) -> None:
        self.max_workers = 1

    async def warm_up(self) -> None: ...

    async def close(self) -> None: ...

    async def once(self, key: str, work: Callable[[], Any]) -> tuple[Any, bool]:
        return await work(), False

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        from api.plan_job import plan_job
        from api.worker import JobFailed

        try:
            result = await asyncio.to_thread(plan_job, json.loads(json.dumps(job)))
        except TimeoutError:
            raise
        except BaseException as e:
            raise JobFailed(500, f"the planner process died: {type(e).__name__}: {e}") from None
        if "status" in result:
            raise JobFailed(result["status"], result["message"], result.get("line"), result.get("column"))
        return result


def service_client(db: Path) -> Any:
    from fastapi.testclient import TestClient

    from api import create_app
    from api.settings import Settings

    app = create_app(Settings(db_path=db, max_body_bytes=4 << 20))
    # An exception out of a route is what a 500 is made of: it reaches the caller here, with its traceback.
    client = TestClient(app, raise_server_exceptions=True)
    app.state.workers = InProcessWorkers()
    return client


def through_service(r: random.Random, item: Input, client: Any) -> str:
    """HTTP status of one request, as 'HTTP N'; raises on a 5xx or an error without a string detail."""
    text = item.data.decode("utf-8", "replace")
    how = r.choice(["json", "json", "upload", "paste"])
    settings: dict[str, Any] = {}
    if r.random() < 0.5:
        settings["mesh"] = r.choice(MESHES)
    if r.random() < 0.4:
        settings[r.choice(["chip", "hbm_bytes"])] = r.choice(["v6e", "v9", "32GiB", "32", "-1", "0", "1e999GiB"])
    if how == "json":
        body: dict[str, Any] = {"hlo": text}
        if "mesh" in settings:
            axes = [a.split("=") for a in settings["mesh"].split(",") if "=" in a]
            body["mesh"] = {"shape": [int(s) if s.lstrip("-").isdigit() else s for _, s in axes],
                            "axis_names": [n for n, _ in axes]}  # fmt: skip
        if "chip" in settings:
            body["chip"] = settings["chip"]
        if "hbm_bytes" in settings:
            body["hbm_bytes"] = r.choice([-1, 0, 10**30, "32GiB", 1 << 35])
        response = client.post("/plan", json=body)
    elif how == "upload":
        response = client.post("/plan", data=settings, files={"hlo_file": ("step.hlo", item.data)})
    else:
        response = client.post("/plan", data={"hlo": text, **settings}, files={"hlo_file": ("", b"")})
    if response.status_code >= 500:
        raise AssertionError(f"HTTP {response.status_code} ({how}): {response.text[:2000]}")
    if response.status_code >= 400 and not isinstance(response.json().get("detail"), str):
        raise AssertionError(f"HTTP {response.status_code} ({how}) without a string detail: {response.text[:500]}")
    return f"HTTP {response.status_code}"


def run(num_inputs: int, seed: int, progress: bool = False) -> Tally:
    r = random.Random(seed)
    texts = seeds()
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        workdir = Path(tmp)
        client = service_client(workdir / "plans.sqlite3")
        for n in range(num_inputs):
            item = generate(r, texts)
            surface = "cli" if n % 2 == 0 else "service"
            start = time.perf_counter()
            try:
                with time_bound(SECONDS_PER_INPUT):
                    answer = through_cli(r, item, workdir) if surface == "cli" else through_service(r, item, client)
                tally.answers[f"{surface}: {answer}"] += 1
            except BaseException as e:  # everything that escaped is the finding
                if isinstance(e, KeyboardInterrupt):
                    raise
                where = "".join(traceback.format_exception(e, limit=-3)[-4:])
                tally.failures.append(f"{surface} {item.kind} (input {n}): {type(e).__name__}: {str(e)[:600]}\n{where}")
                tally.failed_inputs.append(item.data)
            spent = time.perf_counter() - start
            tally.seconds += spent
            tally.slowest = max(tally.slowest, spent)
            if progress and (n + 1) % 500 == 0:
                print(f"  {n + 1} inputs, {len(tally.failures)} failures, {tally.seconds:.0f} s", flush=True)
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, help="write each failing input here, to replay it")
    args = ap.parse_args()
    tally = run(args.inputs, args.seed, progress=True)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(tally.failed_inputs):
            (args.keep / f"failure_{i}.input").write_bytes(data)
    for failure in tally.failures[:20]:
        print("FAILURE", failure)
    cli = sum(v for k, v in tally.answers.items() if k.startswith("cli"))
    service = sum(v for k, v in tally.answers.items() if k.startswith("service"))
    print("answers:", ", ".join(f"{k} x{v}" for k, v in sorted(tally.answers.items())))
    print(
        f"fuzz: {args.inputs} inputs (seed {args.seed}): CLI {cli} answered, service {service} answered, "
        f"{len(tally.failures)} tracebacks or 5xx; {tally.seconds:.0f} s, slowest input {tally.slowest:.1f} s"
    )
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
