"""Verify a plan with real XLA: compile the original and the patched module, compare.

Each module is compiled in a subprocess of its own, with a time limit, so a
crash or hang in XLA cannot take the planner with it, by the XLA that compiles
such modules for real: torch_xla's modules by torch_xla's own XLA
(`torch_xla_compile`), JAX's by jaxlib (`xla_compile`). "Before" is the module
with its calls inlined, the form the placements are written into, so the
saving is the change set's alone; the module as given is compiled too.
jaxlib's compile path canonicalizes the MLIR it is given, and a call is a
wall the canonicalizer does not cross: a JAX step as given went through that
path with its calls, but its inlined and patched forms never did, and handed
over plainly the canonicalizer would rewrite across the calls XLA inlines
later (a GPT-2 step with tied embeddings on v5e: 994.8 MiB per chip as given,
1,413.1 MiB for its inlined form compiled plainly, 994.8 MiB through the
faithful conversion). So the forms the planner writes go through the faithful
conversion (`planner.plan.compilers.stablehlo`), as torch_xla's modules always do.
Reported next to our prediction for the same compiler: XLA's bytes per device before and after, and
whether every stacked gradient of the patched module's partitioned While loops
is at its parameter's shard. For a TPU chip preset with libtpu installed,
XLA:TPU compiles both modules too. libtpu is reached only through jaxlib,
which takes StableHLO; a torch_xla module goes there through the faithful
conversion (`planner.plan.compilers.stablehlo`), whose XLA:CPU gives torch_xla's own
bytes and loop shapes on every corpus step. A module the conversion cannot
keep (`UnfaithfulConversion`) has XLA:TPU withheld, with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from planner.errors import CompileFailed, CompilerMissing, UnfaithfulConversion, Unverifiable
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape, parse_shape
from planner.hlo.structure.frontend import is_torch_xla_module
from planner.hlo.text.printer import print_module
from planner.hlo.text.shardy_import import partitioner_of
from planner.plan.compilers.jax_releases import unreadable_module
from planner.plan.compilers.torch_xla_compile import host_budget_bytes, parameter_specs, parameters_fit_host
from planner.plan.diagnosis.scan_pairs import StackedGradient
from planner.plan.model import TpuVerification, Verification
from planner.progress import note
from planner.scanner import Cursor

# Propagation to the outputs: one flag for every output, or one per output.
OutputFlags = bool | tuple[bool, ...]

TIME_LIMIT_SECONDS = 600

# How the forms the planner writes reach jaxlib: behind the calls that keep MLIR's canonicalizer out.
FAITHFUL = "faithful"


@dataclass(frozen=True)
class Predicted:
    """Our HBM per chip before and after the plan, for XLA:CPU and (for a TPU preset) that chip's XLA:TPU."""

    cpu_before: int
    cpu_after: int
    tpu_before: int | None = None
    tpu_after: int | None = None


def _run(entry: str, request: dict, timeout: float, needs: str) -> dict:
    """The child's report on one module. Every way it has none is an `Unverifiable` of its own cause: the
    compiler not installed, text the installed jaxlib cannot read, XLA failing or out of time."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", entry],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CompileFailed(f"XLA did not finish compiling within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise _failure(done.returncode, done.stderr, request, needs)
    report: dict = json.loads(done.stdout.strip().splitlines()[-1])
    refused = report.get("refused")
    if refused is not None:
        raise unreadable_module(request["hlo"], refused["reason"], refused["line_text"], refused["jaxlib"])
    return report


def _failure(returncode: int, stderr: str, request: dict, needs: str) -> Unverifiable:
    """Why a child exited without a report: the compiler it imports missing, or XLA's error in one line."""
    if "No module named 'jax" in stderr or "No module named 'torch" in stderr:
        extra = "jax" if needs == "jaxlib" else "xla"
        return CompilerMissing(
            f"{needs} is not installed: install the `{extra}` extra (pip install 'spmd-planner[{extra}]')"
        )
    if request.get("tpu_topology") and "libtpu" in stderr.lower() and "not found" in stderr.lower():
        return CompilerMissing("libtpu is not installed: install the `tpu` extra (pip install 'spmd-planner[tpu]')")
    if returncode < 0:
        return CompileFailed(f"XLA's compile was killed by signal {-returncode} (out of memory, or stopped)")
    return CompileFailed(f"XLA could not compile the module: {error_line(stderr)}")


# The line a Python traceback ends with, `jaxlib._jax.XlaRuntimeError: INTERNAL: ...`, without its module path.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*(\w*(?:Error|Exception|Exit)): (.*)$")


def error_line(stderr: str) -> str:
    """A child's error in one line: its traceback's last exception line (XLA's message continues on the next
    line when it ends at a colon; the text it quotes and its caret line are left out), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        found = _EXCEPTION_LINE.match(lines[i])
        if found is not None:
            message = f"{found.group(1)}: {found.group(2)}"
            if message.endswith(":") and i + 1 < len(lines):
                message = f"{message} {lines[i + 1]}"
            return message
    return lines[-1] if lines else "the compile's child failed without a word"


def compile_with_xla(
    text: str,
    num_devices: int,
    allow_output: OutputFlags,
    timeout: float = TIME_LIMIT_SECONDS,
    tpu_topology: str | None = None,
    conversion: str | None = None,
    partitioner: str = "gspmd",
) -> dict:
    """jaxlib's report for one module (see `xla_compile`): XLA:CPU, or XLA:TPU for `tpu_topology`, with
    `partitioner` (the one the module names: `planner.hlo.text.shardy_import.partitioner_of`).

    `conversion` ("faithful" or "plain") overrides how the text becomes StableHLO (default: a torch_xla
    module faithfully, a JAX module as JAX's compile takes it). Raises `UnfaithfulConversion` for a
    module the faithful conversion cannot keep, another `Unverifiable` where the compile gives no report.
    """
    # The child writes the text as its own jaxlib reads it (`planner.hlo.text.jaxlib_api.text_for_jaxlib`).
    request = {"hlo": text, "num_devices": num_devices, "allow_output": allow_output,
               "tpu_topology": tpu_topology, "conversion": conversion, "partitioner": partitioner}  # fmt: skip
    report = _run("planner.plan.compilers.xla_compile", request, timeout, "jaxlib")
    if "unfaithful" in report:
        raise UnfaithfulConversion(report["unfaithful"])
    return report


def compile_with_torch_xla(
    module: HloModule, num_devices: int, timeout: float = TIME_LIMIT_SECONDS, text: str | None = None
) -> dict:
    """torch_xla's own XLA's report for one module (see `torch_xla_compile`); `text` when already printed.

    Raises `Unverifiable`, before starting the child, for parameters torch_xla cannot be fed or this
    machine cannot hold.
    """
    parameters = parameter_specs(module)
    parameters_fit_host(parameters, num_devices, host_budget_bytes())
    request = {"hlo": print_module(module) if text is None else text, "num_devices": num_devices,
               "parameters": parameters}  # fmt: skip
    return _run("planner.plan.compilers.torch_xla_compile", request, timeout, "torch_xla")


def output_propagation(module: HloModule) -> OutputFlags:
    """Which outputs the module's header lets propagation shard, as the compile it came from did: one
    flag for all when the header's flags agree, else one per output (JAX's step returning params and
    optimizer state pinned and gradients free). Collapsing those into one flag would let XLA reshard a
    donated output away from its input's size."""
    flags = tuple(module.attr("allow_spmd_sharding_propagation_to_output") or (False,))
    return flags[0] if len(set(flags)) == 1 else flags


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


@dataclass(frozen=True)
class Texts:
    """The three modules verify compiles, printed: as given, inlined (what placements are written into), patched.

    The saving is inlined minus patched, both compiled the same way (`compile_forms`), so it is the change
    set's alone.
    """

    given: str
    inlined: str
    patched: str


def verify(
    original: HloModule,
    inlined: HloModule,
    patched: HloModule,
    gradients: list[StackedGradient],
    num_devices: int,
    predicted: Predicted,
    tpu_topology: str | None = None,
) -> Verification:
    """The XLA that compiles such modules compiles the module as given, inlined and patched; with
    `tpu_topology` (and libtpu), XLA:TPU too.

    Raises `Unverifiable` when no faithful compile is possible here or a compile gives no report (its `cause`
    says which kind, the message why). XLA:TPU's own failures are `tpu_skipped`: XLA:CPU's report stands.
    """
    allow_output = output_propagation(original)
    # A JAX module compiles with the partitioner it names, as its user's compile does; torch_xla's XLA runs GSPMD.
    partitioner = partitioner_of(original)
    start = time.perf_counter()
    texts = Texts(print_module(original), print_module(inlined), print_module(patched))
    torch_xla = is_torch_xla_module(original)
    # torch_xla's modules reach jaxlib faithfully by default, the forms written from them included.
    derived_conversion = None if torch_xla else FAITHFUL
    if torch_xla:
        modules = {texts.given: original, texts.inlined: inlined, texts.patched: patched}
        given, before, after = compile_forms(
            texts, lambda t, _: compile_with_torch_xla(modules[t], num_devices, text=t), derived_conversion
        )
    else:
        given, before, after = compile_forms(
            texts,
            lambda t, c: compile_with_xla(t, num_devices, allow_output, conversion=c, partitioner=partitioner),
            derived_conversion,
        )
    mismatches, check = gradient_mismatches(after["while_shapes"], patched, gradients)
    tpu, tpu_skipped = None, None
    if tpu_topology is not None:
        tpu, tpu_skipped = verify_on_tpu(
            texts, num_devices, allow_output, tpu_topology, predicted, derived_conversion, partitioner
        )
    return Verification(
        xla=after["xla"],
        frontend="torch_xla" if torch_xla else "jax",
        partitioner="gspmd" if torch_xla else partitioner,
        num_devices=num_devices,
        given_total_bytes=given["total_bytes"],
        before_total_bytes=before["total_bytes"],
        after_total_bytes=after["total_bytes"],
        predicted_saving_bytes=predicted.cpu_before - predicted.cpu_after,
        xla_saving_bytes=before["total_bytes"] - after["total_bytes"],
        predicted_before_bytes=predicted.cpu_before,
        predicted_after_bytes=predicted.cpu_after,
        after_while_shapes=[w["shape"] for w in after["while_shapes"]],
        stacked_gradients_at_shard=check is None and not mismatches,
        gradient_mismatches=mismatches,
        gradient_check=check,
        tpu=tpu,
        tpu_skipped=tpu_skipped,
        seconds=round(time.perf_counter() - start, 3),
    )


def compile_forms(
    texts: Texts,
    compile_text: Callable[[str, str | None], dict],
    derived_conversion: str | None,
    compiler: str = "XLA:CPU",
) -> tuple[dict, dict, dict]:
    """The compiler's reports for the given, inlined and patched texts, each distinct compile made once.

    The given text compiles as its front end's compile takes it; the inlined and patched texts with
    `derived_conversion`. Where the faithful conversion cannot keep a derived form (`UnfaithfulConversion`:
    a JAX step with an identity reshape carrying a sharding), both derived forms compile as the given
    one does, so before and after still differ by the change set alone.
    """
    reports: dict[tuple[str, str | None], dict] = {}

    def report(form: str, text: str, conversion: str | None) -> dict:
        if (text, conversion) not in reports:
            note(f"{compiler}: compiling {form}")
            reports[text, conversion] = compile_text(text, conversion)
        return reports[text, conversion]

    given = report("the step as given", texts.given, None)
    try:
        return (given, report("the inlined step", texts.inlined, derived_conversion),
                report("the patched step", texts.patched, derived_conversion))  # fmt: skip
    except UnfaithfulConversion:
        if derived_conversion is None:
            raise
        return given, report("the inlined step", texts.inlined, None), report("the patched step", texts.patched, None)


def verify_on_tpu(
    texts: Texts,
    num_devices: int,
    allow_output: OutputFlags,
    topology: str,
    predicted: Predicted,
    derived_conversion: str | None,
    partitioner: str = "gspmd",
) -> tuple[TpuVerification | None, str | None]:
    """XLA:TPU on the given, inlined and patched modules' text, or why not: no libtpu, or a module jaxlib
    cannot be given as it is (the conversion's reason; a torch_xla module goes through
    `planner.plan.compilers.stablehlo`)."""
    if not libtpu_installed():
        return None, "libtpu is not installed: install the `tpu` extra (pip install 'spmd-planner[tpu]')"
    try:
        given, before, after = compile_forms(
            texts,
            lambda t, c: compile_with_xla(
                t, num_devices, allow_output, tpu_topology=topology, conversion=c, partitioner=partitioner
            ),
            derived_conversion,
            "XLA:TPU",
        )
    except UnfaithfulConversion as e:
        return None, (
            "XLA:TPU is reached only through jaxlib's StableHLO, and the module has none that jaxlib's compile "
            f"path turns back into it: {e}"
        )
    except Unverifiable as e:
        return None, str(e)
    return TpuVerification(
        xla=after["xla"],
        topology=topology,
        given_total_bytes=given["total_bytes"],
        before_total_bytes=before["total_bytes"],
        after_total_bytes=after["total_bytes"],
        xla_saving_bytes=before["total_bytes"] - after["total_bytes"],
        predicted_before_bytes=predicted.tpu_before,
        predicted_after_bytes=predicted.tpu_after,
    ), None


def _first_misfit(partitioned: Shape, ours: Shape) -> str | None:
    """The first carried element whose per-device shape cannot be a shard of the module's element there (another
    rank or element type, or larger along a dim), in words; None when every element can be."""
    for i, (theirs, mine) in enumerate(zip(partitioned.leaves(), ours.leaves())):
        fits = (
            isinstance(theirs, ArrayShape)
            and isinstance(mine, ArrayShape)
            and theirs.element_type == mine.element_type
            and len(theirs.dims) == len(mine.dims)
            and all(t <= m for t, m in zip(theirs.dims, mine.dims))
        )
        if not fits:
            return f"{theirs.to_text(False)} per device at element {i}, where the module's is {mine.to_text(False)}"
    return None


def gradient_mismatches(
    xla_whiles: list[dict], module: HloModule, gradients: list[StackedGradient]
) -> tuple[list[str], str | None]:
    """Stacked gradients whose per-device shape in XLA's partitioned loops exceeds their parameter's shard.

    XLA renames loops when it partitions; a loop is found again as the k-th loop carrying as many
    elements as it does, k counted in program text order on both sides. The second value says why
    the check could not be made, when a loop is not found that way.
    """
    parsed = [parse_shape(Cursor(w["shape"]), {}) for w in xla_whiles]
    partitioned = [s for s in parsed if isinstance(s, TupleShape)]
    ours = [i for c in module.computations for i in c.instructions if i.opcode == "while"]
    problems: list[str] = []
    for g in gradients:
        if g.ideal is None:
            continue
        loop = module.instruction(g.loop)
        arity = len(loop.shape.leaves())
        same_arity = [i.name for i in ours if len(i.shape.leaves()) == arity]
        matches = [s for s in partitioned if len(s.leaves()) == arity]
        if len(matches) != len(same_arity):
            return [], (
                f"XLA's partitioned module has {len(matches)} loops carrying {arity} elements where the module has "
                f"{len(same_arity)} ({g.loop}): the loops changed before partitioning, so gradients cannot be "
                "matched to XLA's shapes"
            )
        theirs = matches[same_arity.index(g.loop)]
        misfit = _first_misfit(theirs, loop.shape)
        if misfit is not None:
            return [], (
                f"XLA's partitioned loop in {g.loop}'s place carries {misfit}: its elements are not the module's "
                "in the module's order (the loop changed before partitioning), so gradients cannot be matched to "
                "XLA's shapes"
            )
        got = theirs.leaves()[g.index].dims
        want = g.ideal.shard_shape(g.shape.dims)
        if tuple(got) != tuple(want) and g.shape.bytes_for_dims(got) > g.shape.bytes_for_dims(want):
            problems.append(
                f"{g.key} {g.shape.to_text(False)}: XLA keeps {list(got)} per device, shard is {list(want)}"
            )
    return problems, None
