"""Our Shardy engine against jaxlib's real Shardy passes, op by op, on any StableHLO module.

    python -m fidelity.shardy_diff MODULE.mlir [MODULE.mlir ...] [--pipeline sdy-propagation-pipeline] [--show N]

For a real step the right input is the module XLA's Shardy pass propagates: XLA writes it as
`shardy/<module>/01.before_propagation.mlir` in its dump (`--xla_dump_to`, with the pass dumped).
Each single-line op is given a location of its own (`t<k>c0`), the module is propagated by jaxlib's
Shardy passes (the truth) and, converted to HLO as the planner reads StableHLO, by our engine; the
shardings are compared per op as Shardy prints them (`fidelity.shardy_lit`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from fidelity.shardy_lit import CaseResult, declared_meshes
from fidelity.shardy_values import expectations
from planner.hlo.ir.module import Instruction
from planner.hlo.text.parser import parse_hlo
from planner.hlo.text.shardy_import import module_meshes
from planner.hlo.text.stablehlo_text import read_stablehlo
from planner.propagation.shardy.pipeline import run_export, run_import
from planner.propagation.shardy.program import build_program
from planner.propagation.shardy.schedule import propagate

_OP_LINE = re.compile(r"^(\s*)((?:%[\w#:, %]+ = )?(?:stablehlo|sdy|func)\.[\w.]+.*?)(\s*)$")
_TRAILING_LOC = re.compile(r"\s+loc\((?:#loc\d*|\"[^\"]*\")\)\s*$")
_ARG_LINE = re.compile(r"^\s*(?:func\.func|\^bb|cond|do|\}|\{|module|sdy\.mesh)")


def tag_ops(text: str) -> str:
    """Every single-line op ends with `loc("t<k>c0")`; region ops and the rest are left as they are."""
    out = []
    k = 0
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if not line.startswith("#"):
            line = _TRAILING_LOC.sub("", line)
        m = _OP_LINE.match(line)
        following = lines[n + 1].strip() if n + 1 < len(lines) else ""
        opens_region = line.rstrip().endswith(("{", "(")) or following.startswith(("cond", "{", "^", "("))
        returns = m is not None and m.group(2).startswith(("func.return", "stablehlo.return", "sdy.return"))
        if m and not returns and not _ARG_LINE.match(line) and not opens_region and " loc(" not in line:
            line = f'{m.group(1)}{m.group(2)} loc("t{k}c0")'
            k += 1
        out.append(line)
    return "\n".join(out) + "\n"


def truth(text: str, pipeline: str) -> dict[str, str]:
    """Per op location and function argument/result, the sharding jaxlib's Shardy passes give it."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir, passmanager

    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)
        passmanager.PassManager.parse(f"builtin.module({pipeline})").run(module.operation)
        printed = module.operation.get_asm(enable_debug_info=True)
    return _read_printed(printed)


_LOC_DEF = re.compile(r'^#(loc\d+) = loc\("(t\d+c0)"\)', re.M)
_SHARDING_START = re.compile(r"sdy\.sharding = (#sdy\.sharding(?:_per_value)?<)")


def _sharding_attr(text: str) -> str | None:
    """The first `sdy.sharding = #sdy.sharding...<...>` in `text`, its angle brackets balanced."""
    m = _SHARDING_START.search(text)
    if m is None:
        return None
    depth = 0
    for i in range(m.start(1), len(text)):
        if text[i] == "<":
            depth += 1
        elif text[i] == ">":
            depth -= 1
            if depth == 0:
                return text[m.start(1) : i + 1]
    return None


def _read_printed(printed: str) -> dict[str, str]:
    aliases = dict(_LOC_DEF.findall(printed))
    out: dict[str, str] = {}
    main = printed[printed.find("func.func @main") :]
    header = main[: main.find("{\n")]
    head_args, _, head_results = header.partition(") -> ")
    for i, m in enumerate(re.finditer(r"%arg\d+: tensor<[^>]*>(?: \{([^}]*)\})?", head_args)):
        found = _sharding_attr(m.group(1) or "")
        if found:
            out[f"@arg:{i}"] = found
    for i, m in enumerate(re.finditer(r"tensor<[^>]*>(?: \{([^}]*)\})?", head_results)):
        found = _sharding_attr(m.group(1) or "")
        if found:
            out[f"@result:{i}"] = found
    for line in printed.splitlines():
        loc = re.search(r'loc\((?:"(t\d+c0)"|#(loc\d+))\)\s*$', line)
        if not loc:
            continue
        tag = loc.group(1) or aliases.get(loc.group(2) or "")
        found = _sharding_attr(line)
        if tag and found:
            out[tag] = found
    return out


def _tag_number(inst: Instruction) -> int:
    """The op's place in the MLIR module, from the location `tag_ops` gave it."""
    m = re.match(r"t(\d+)c0", inst.metadata.op_name or "") if inst.metadata is not None else None
    return int(m.group(1)) if m else -1


def ours(text: str) -> tuple[dict[str, str], dict, set[str]]:  # type: ignore[type-arg]
    """Our shardings, the meshes, and the op locations the converted module still names (jaxlib's
    converter drops some: a broadcast of a scalar loses its location)."""
    module = parse_hlo(read_stablehlo(text))
    named = {i.metadata.op_name for c in module.computations for i in c.instructions if i.metadata is not None}
    meshes = module_meshes(module)
    program = build_program(module, meshes, order_key=_tag_number)
    run_import(program)
    propagate(program, "user-priority")
    run_export(program)
    return expectations(program, edges_sunk=True, constraints_as_reshards=True), meshes, {n for n in named if n}


def compare(path: Path, pipeline: str) -> CaseResult:
    tagged = tag_ops(path.read_text())
    expected = truth(tagged, pipeline)
    got, meshes, named = ours(tagged)
    lost = {k for k in expected if not k.startswith("@") and k not in named}
    result = CaseResult(path.name, str(path), {k: v for k, v in expected.items() if k not in lost}, got)
    result.uncompared = len(lost)
    result.test_meshes = declared_meshes(tagged)
    result.module_meshes = meshes
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", type=Path, nargs="+")
    ap.add_argument("--pipeline", default="sdy-propagation-pipeline")
    ap.add_argument("--show", type=int, default=20, help="differing values printed per module")
    args = ap.parse_args(argv)
    total_equal = total = 0
    for path in args.modules:
        result = compare(path, args.pipeline)
        missed = result.missed
        equal = len(result.expected) - len(missed)
        total_equal, total = total_equal + equal, total + len(result.expected)
        left_out = f"{result.uncompared} ops lost their location in the HLO conversion" if result.uncompared else ""
        print(f"{path}: {equal} of {len(result.expected)} values equal ({left_out or 'all ops compared'})")
        for key in missed[: args.show]:
            print(f"  {key}\n    shardy {result.expected[key]}\n    ours   {result.got.get(key)}")
    if len(args.modules) > 1:
        print(f"all: {total_equal} of {total} values equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
