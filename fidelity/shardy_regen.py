"""Shardy's propagation lit tests made into cases by the installed jaxlib's own Shardy passes.

Each test file's RUN line is run the way `sdy_opt` runs it, with jaxlib's MLIR pass manager (jaxlib
bundles the sdy dialect and registers its passes), chunk by chunk. Every function of a chunk that no
other function calls becomes a case (the format of `shared/shardy_cases*/shardy_propagation_cases.json`):

- `module`: the chunk with that function renamed `@main`, the functions it does not reach left out, and
  each location named `l<line>c<col>` after the test file, so an expectation names the op the test wrote;
- `expect`: every sharding the passes leave on the function's arguments (`@arg:N`), results
  (`@result:N`) and ops (by location; a manual or named computation's `in_shardings` / `out_shardings`
  as `<loc>:in_shardings`), printed by jaxlib; `rules` instead for a RUN line that populates rules;
- `expect_hlo`: the same module, propagated, converted to HLO by jaxlib as JAX's compile converts it:
  each instruction's HloSharding by location, and the entry's `@param:N` and `@root`.

The chunk as the test wrote it is also run and printed, and FileCheck checks that output against the
chunk's CHECK lines: `filecheck` says whether this jaxlib prints what the test expects of its Shardy.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fidelity.hlo_shardings import hlo_shardings
from fidelity.lit_files import Chunk, RunLine, run_lines, split_chunks, textual_pipeline

_FILE_LOC = re.compile(r'loc\("([^"]*)":(\d+):(\d+)\)')
_NAME_LOC = re.compile(r'^loc\("(l\d+c\d+)"\)$')
_RULE_PASS = "sdy-populate-op-sharding-rules"
_ERROR_CHARS = 200  # XLA's messages can carry a whole shape or module
_SINK = "builtin.module(func.func(sdy-sink-data-flow-edges))"
# Attributes that hold a sharding on an op: its results', an edge's or constraint's, a computation's.
_OP_SHARDINGS = (
    ("sdy.sharding", ""),
    ("sharding", ""),
    ("in_shardings", ":in_shardings"),
    ("out_shardings", ":out_shardings"),
)


@dataclass
class FileReport:
    """One lit file: what was run and how FileCheck judged each chunk."""

    source: str
    runs: list[str]
    chunks: int = 0
    functions: int = 0
    check_lines: int = 0
    filecheck: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    filecheck_failures: list[str] = field(default_factory=list)  # FileCheck's first complaint per chunk

    def as_json(self) -> dict[str, Any]:
        counts = {k: self.filecheck.get(k, 0) for k in ("pass", "fail", "skipped")}
        return {
            "source": self.source,
            "runs": self.runs,
            "chunks": self.chunks,
            "functions": self.functions,
            "check_lines": self.check_lines,
            "filecheck": counts,
            "errors": self.errors,
            "filecheck_failures": self.filecheck_failures,
        }


class Shardy:
    """jaxlib's MLIR context with JAX's dialects (sdy among them) and its pass manager."""

    def __init__(self, filecheck: str) -> None:
        from jax._src.interpreters import mlir as jax_mlir
        from jaxlib.mlir import ir, passmanager

        self.ir, self.passmanager, self.filecheck = ir, passmanager, filecheck
        self.context = jax_mlir.make_ir_context()
        self.module_to_bytecode = jax_mlir.module_to_bytecode
        self.diagnostics: list[str] = []
        self.context.attach_diagnostic_handler(self._diagnostic)
        self._anchors: dict[str, str] = {}

    def _diagnostic(self, diagnostic: Any) -> bool:
        self.diagnostics.append(f"{diagnostic.severity}: {diagnostic.message}")
        return True

    @contextmanager
    def collecting(self) -> Iterator[list[str]]:
        self.diagnostics = []
        yield self.diagnostics

    def anchor(self, name: str) -> str:
        """The op a pass runs on: `sdy_opt -pass` nests a function pass under `func.func` by itself."""
        if name not in self._anchors:
            with self.context:
                try:
                    self.passmanager.PassManager.parse(f"builtin.module({name})")
                    self._anchors[name] = "builtin.module"
                except ValueError:
                    self._anchors[name] = "func.func"
        return self._anchors[name]

    def pipeline(self, run: RunLine) -> str:
        names = {p.split("{")[0] for p in run.passes}
        return textual_pipeline(run.passes, {n: self.anchor(n) for n in names})

    def parse(self, text: str) -> Any:
        with self.context:
            return self.ir.Module.parse(text)

    def run(self, module: Any, pipeline: str) -> None:
        with self.context:
            self.passmanager.PassManager.parse(pipeline).run(module.operation)


def relocated(printed: str, offset: int) -> str:
    """Module text printed with locations, each file location `"f":L:C` renamed `l<L+offset>c<C>`."""
    return _FILE_LOC.sub(lambda m: f'loc("l{int(m.group(2)) + offset}c{m.group(3)}")', printed)


def _functions(module: Any) -> list[Any]:
    return [op for op in module.body.operations if op.operation.name == "func.func"]


def _name(func: Any) -> str:
    return str(func.attributes["sym_name"]).strip('"')


def root_functions(module: Any) -> list[str]:
    """Functions no other function of the module calls: each is a test of its own."""
    names = [_name(f) for f in _functions(module)]
    called = {c for f in _functions(module) for c in _callees(f) if c != _name(f)}
    return [n for n in names if n not in called]


def _callees(op: Any) -> Iterator[str]:
    """Functions an op names (`call @f`, a region's `func.call`s), found in its printed form."""
    yield from re.findall(r"@([\w.$-]+)", str(op))


def reachable(module: Any, root: str) -> set[str]:
    by_name = {_name(f): f for f in _functions(module)}
    seen, todo = {root}, [root]
    while todo:
        for callee in _callees(by_name[todo.pop()]):
            if callee in by_name and callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen


def case_module_text(shardy: Shardy, chunk: Chunk, root: str, sink: bool = True) -> tuple[str, str | None]:
    """The chunk as the case's module: `root` renamed `@main`, unreached functions dropped, locations named,
    and data-flow edges the test wrote sunk into their owners (the form JAX's lowering writes, which
    jaxlib's converter to HLO reads); with why sinking failed, if it did."""
    module = shardy.parse(chunk.text)
    keep = reachable(module, root)
    with shardy.context:
        for func in _functions(module):
            name = _name(func)
            if name not in keep:
                func.operation.erase()
            elif name == root:
                func.attributes["sym_name"] = shardy.ir.StringAttr.get("main")
        if root != "main":
            _rename_calls(module, root, shardy)
    with shardy.context:
        written = module.operation.get_asm(enable_debug_info=True)
    sink_error = sink_edges(shardy, module) if sink else None
    if not sink or sink_error is not None:  # a failed pass leaves a module half rewritten: the test's stays
        return relocated(written, chunk.line_offset), sink_error
    with shardy.context:
        return relocated(module.operation.get_asm(enable_debug_info=True), chunk.line_offset), None


def sink_edges(shardy: Shardy, module: Any) -> str | None:
    """Run Shardy's own `sdy-sink-data-flow-edges` where the module has edge ops; why it failed, if it did."""
    if "sdy.data_flow_edge" not in str(module):
        return None
    try:
        shardy.run(module, _SINK)
    except Exception as error:
        return _last_line(error)
    return None


def _rename_calls(module: Any, root: str, shardy: Shardy) -> None:
    """Calls of the root (a recursive test) follow its new name."""
    for func in _functions(module):
        for op in _walk(func):
            if "callee" in op.attributes and str(op.attributes["callee"]) == f"@{root}":
                op.attributes["callee"] = shardy.ir.FlatSymbolRefAttr.get("main")


def _walk(op: Any) -> Iterator[Any]:
    for region in op.operation.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _walk(inner)


def _location(op: Any) -> str | None:
    m = _NAME_LOC.match(str(op.location))
    return m.group(1) if m else None


def value_shardings(module: Any) -> dict[str, str]:
    """`@arg:N`, `@result:N` of `@main`, and each located op's shardings, as jaxlib prints them."""
    main = next(f for f in _functions(module) if _name(f) == "main")
    out: dict[str, str] = {}
    for kind, attrs in (("arg", "arg_attrs"), ("result", "res_attrs")):
        if attrs in main.attributes:
            for i, entry in enumerate(main.attributes[attrs]):
                d = shardy_dict(entry)
                if "sdy.sharding" in d:
                    out[f"@{kind}:{i}"] = d["sdy.sharding"]
    for op in _walk(main):  # a callee's ops are the callee's test, not this one's
        loc = _location(op)
        if loc is None:
            continue
        for attr, suffix in _OP_SHARDINGS:
            if attr in op.attributes:
                out.setdefault(loc + suffix, str(op.attributes[attr]))
    return out


def shardy_dict(entry: Any) -> dict[str, str]:
    """A DictAttr of one argument's or result's attributes as name -> printed value."""
    return {named.name: str(named.attr) for named in entry}


def op_rules(module: Any) -> dict[str, str]:
    """Each located op's sharding rule; an op inside a region sharing its parent's location (a reduce's
    body written `applies stablehlo.add`) leaves the parent's."""
    out: dict[str, str] = {}
    for func in _functions(module):
        for op in _walk(func):
            loc = _location(op)
            if loc is not None and "sdy.sharding_rule" in op.attributes:
                out.setdefault(loc, str(op.attributes["sdy.sharding_rule"]))
    return out


def filecheck(shardy: Shardy, chunk: Chunk, output: str) -> str | None:
    """None when FileCheck reads `output` as the chunk's CHECK lines ask, else its first complaint (which
    names the test file's line: the chunk is checked at its place in the file)."""
    with tempfile.TemporaryDirectory() as tmp:
        checks = Path(tmp, "checks.mlir")
        checks.write_text("\n" * chunk.line_offset + chunk.text)
        done = subprocess.run([shardy.filecheck, str(checks)], input=output, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    complaint = next((line for line in done.stderr.splitlines() if "error:" in line), done.stderr.strip())
    return complaint.replace(str(checks), "").lstrip(":")


def chunk_cases(shardy: Shardy, source: str, run: RunLine, chunk: Chunk, report: FileReport) -> list[dict[str, Any]]:
    """Run one chunk as the test wrote it (FileCheck), then each of its public functions as a case."""
    try:
        module = shardy.parse(chunk.text)
    except Exception as error:  # a chunk jaxlib cannot read is reported with the file
        report.errors.append(f"line {chunk.first_line}: {_first_line(error)}")
        return []
    roots = root_functions(module)
    if not roots:
        return []
    report.chunks += 1
    report.functions += len(roots)
    pipeline = shardy.pipeline(run)
    status = "skipped"
    try:
        shardy.run(module, pipeline)
        if run.filecheck and "CHECK" in chunk.text:
            complaint = filecheck(shardy, chunk, str(module))
            status = "pass" if complaint is None else "fail"
            if complaint is not None:
                report.filecheck_failures.append(complaint)
    except Exception as error:  # the pipeline failing is what this jaxlib does: the case records it
        report.errors.append(f"line {chunk.first_line}: {_first_line(error)}")
    report.filecheck[status] += 1
    kind = "rule" if _RULE_PASS in pipeline else "propagation"
    base = {"source": source, "line": chunk.first_line, "run": run.text, "pipeline": pipeline, "kind": kind}
    return [{"name": root, **base, "filecheck": status, **_case(shardy, chunk, root, pipeline, kind)} for root in roots]


def _case(shardy: Shardy, chunk: Chunk, root: str, pipeline: str, kind: str) -> dict[str, Any]:
    text, sink_error = case_module_text(shardy, chunk, root)
    out: dict[str, Any] = {"module": text}
    if sink_error is not None:
        out["sink_error"] = sink_error
    # The expectations are the test's own: its chunk as written, edge ops and all.
    written, _ = case_module_text(shardy, chunk, root, sink=False)
    module = shardy.parse(written)
    with shardy.collecting() as diagnostics:
        try:
            shardy.run(module, pipeline)
        except Exception as error:
            out["error"] = f"passes: {_first_line(error)}"
            return out
    warnings = [d for d in diagnostics if "ERROR" not in d]
    if warnings:
        out["diagnostics"] = warnings
    if kind == "rule":
        out["rules"] = op_rules(module)
        return out
    out["expect"] = value_shardings(module)
    out.update(_hlo_expectations(shardy, module))
    return out


def _hlo_expectations(shardy: Shardy, module: Any) -> dict[str, Any]:
    from planner.hlo.text import jaxlib_api

    sink_edges(shardy, module)
    try:
        with shardy.context:
            computation = jaxlib_api.stablehlo_to_computation(shardy.module_to_bytecode(module))
        return {"expect_hlo": hlo_shardings(jaxlib_api.short_parsable_text(computation, with_metadata=True))}
    except Exception as error:  # jaxlib refuses to convert: what a user's compile of it would meet
        return {"expect_hlo_error": _first_line(error)[:_ERROR_CHARS]}


def _last_line(error: Exception) -> str:
    text = str(error).rstrip()
    return text.splitlines()[-1] if text else type(error).__name__


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def lit_file_cases(shardy: Shardy, source: str, text: str) -> tuple[list[dict[str, Any]], FileReport]:
    runs = run_lines(text)
    report = FileReport(source, [r.text for r in runs])
    report.check_lines = sum(1 for line in text.splitlines() if re.search(r"//\s*CHECK", line))
    cases: list[dict[str, Any]] = []
    for run in runs:
        for chunk in split_chunks(text, run.split_input):
            cases.extend(chunk_cases(shardy, source, run, chunk, report))
    _name_cases(cases, Path(source).name)
    return cases, report


def _name_cases(cases: list[dict[str, Any]], file: str) -> None:
    """`file::function`, with `@l<line>` where chunks of the file share the function's name."""
    counts = Counter(c["name"] for c in cases)
    for case in cases:
        suffix = f"@l{case['line']}" if counts[case["name"]] > 1 else ""
        case["name"] = f"{file}::{case['name']}{suffix}"


def regenerate(
    shardy: Shardy, files: list[tuple[str, str]], progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Cases for `(source path, text)` lit files, in the shared cases' JSON layout."""
    cases: list[dict[str, Any]] = []
    reports = []
    for source, text in files:
        progress(source)
        file_cases, report = lit_file_cases(shardy, source, text)
        cases.extend(file_cases)
        reports.append(report.as_json())
    return {"files": reports, "cases": cases}
