"""StableHLO text, what `jax.jit(f).lower(...).as_text()` prints by default, read as the HLO module XLA compiles.

A JAX user's first copy of a step is `lowered.as_text()`: MLIR, not HLO. JAX hands XLA this module
converted to HLO (`Lowered.hlo()`, the converter jaxlib exposes) and, beside it, the compile options
the HLO text has no room for. StableHLO keeps them where the HLO text loses them:

- a result `out_shardings` left unspecified carries no sharding attribute (`mhlo.sharding` with GSPMD,
  `sdy.sharding` with Shardy), and JAX lets propagation shard exactly those outputs. In HLO text the
  root needs a sharding for every element as soon as one output is pinned, and `{replicated}` stands
  both for "unspecified" and for "pinned to P()" (`planner.hlo.text.compile_defaults` has to guess there);
- an argument whose in_sharding was left unspecified carries none either (nor does a scalar, which is
  replicated either way);
- `mhlo.num_partitions` on the module is the compile's partition count.

`read_stablehlo` converts with jaxlib and writes these into the HLO header as XLA's own dump of the
compile shows them (`allow_spmd_sharding_propagation_to_parameters`, `..._to_output`,
`num_partitions`), so the module is read exactly as the dump would be. Example: results
`(tensor<64x128xf32> {mhlo.sharding = "{devices=[4,2]<=[8]}"}, tensor<64x128xf32> {jax.result_info =
"result[1]"})` on a module with `mhlo.num_partitions = 8` give `...,
allow_spmd_sharding_propagation_to_output={false,true}, num_partitions=8`.

Instruction names and source lines come from the ops' locations, which `as_text()` leaves out: the
module is the one `as_text(dialect="hlo")` prints, instruction for instruction and id for id, under
generic names (`dot.460` for `dot_general.460`); `as_text(debug_info=True)` keeps both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from planner.errors import HloParseError, PlannerError
from planner.hlo.ir.frontend_attributes import MESHES
from planner.hlo.text import jaxlib_api, stablehlo_compat
from planner.hlo.text.compile_defaults import NUM_PARTITIONS, OUTPUT_FLAGS, PARAMETER_FLAGS, flags_text

SHARDING_ATTRIBUTES = ("mhlo.sharding", "sdy.sharding")
# MLIR text starts with an optional attribute alias block (`#loc = ...`), then `module` or a bare func.
_MLIR_START = re.compile(r"\s*(?://[^\n]*\n\s*)*(module\b|func\.func\b|#[\w.$-]+\s*=)")
_LOCATION = re.compile(r":(\d+):(\d+)")
_FRONTEND_ATTRIBUTES = "frontend_attributes={"


def is_stablehlo_text(text: str) -> bool:
    """Whether `text` is MLIR (a StableHLO module) rather than HLO text."""
    return _MLIR_START.match(text) is not None


@dataclass(frozen=True)
class EntrySignature:
    """What the StableHLO `@main` says that the converted HLO text cannot."""

    results_sharded: tuple[bool, ...]
    result_ranks: tuple[int, ...]
    arguments_sharded: tuple[bool, ...]
    argument_ranks: tuple[int, ...]
    num_partitions: int | None

    def header_options(self) -> str:
        """The compile options as XLA's dump of the compile appends them to the `HloModule` line.

        JAX writes no sharding on a scalar, pinned to P() or not. A scalar is replicated either way, so
        its flag changes nothing XLA decides; it is read the way the step's other outputs are: free when
        out_shardings was left unspecified as a whole (no result carries a sharding), pinned otherwise
        (a trainer pins its loss to P() beside its params).
        """
        to_parameters = (not s and r > 0 for s, r in zip(self.arguments_sharded, self.argument_ranks))
        all_free = not any(self.results_sharded)
        to_output = (not s and (r > 0 or all_free) for s, r in zip(self.results_sharded, self.result_ranks))
        options = [f"{PARAMETER_FLAGS}={flags_text(to_parameters)}", f"{OUTPUT_FLAGS}={flags_text(to_output)}"]
        if self.num_partitions is not None:
            options.append(f"{NUM_PARTITIONS}={self.num_partitions}")
        return ", " + ", ".join(options)


def read_stablehlo(text: str, source: str = "") -> str:
    """HLO text for the StableHLO module `text`, its header carrying the options JAX compiles it with."""
    ir, jax_mlir = _jaxlib(text, source)
    with jax_mlir.make_ir_context():
        try:
            readable = stablehlo_compat.readable_text(text, ir)
        except stablehlo_compat.CompatibilityError as e:
            raise HloParseError.at(text, e.offset, f"StableHLO text: {e}", source) from None
        try:
            module = ir.Module.parse(readable)
        except ir.MLIRError as e:
            diagnostic = e.error_diagnostics[0] if e.error_diagnostics else None
            message = diagnostic.message if diagnostic is not None else str(e)
            line, column = _position(str(diagnostic.location) if diagnostic is not None else "")
            raise _error(text, line, column, f"StableHLO text: {message}{_release_hint(message)}", source) from None
        signature = _entry_signature(ir, module, text, source)
        try:
            # The module as parsed, as bytecode (what JAX's `Lowered.hlo()` converts): not parsed twice.
            bytecode = jax_mlir.module_to_bytecode(module)
            computation = jaxlib_api.mlir_bindings().mlir_module_to_xla_computation(bytecode, use_tuple_args=False)
        except PlannerError:
            raise
        except Exception as e:  # jaxlib raises XlaRuntimeError, which only it can name
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            line, column = _position(first)
            raise _error(text, line, column, f"StableHLO text could not be converted to HLO: {first}", source) from None
    # Source lines where the text kept its locations (as_text(debug_info=True)); without them MLIR would
    # make up `-:LINE` ones from the text's own lines, which name nothing the user wrote.
    hlo = jaxlib_api.short_parsable_text(computation, with_metadata="loc(" in text)
    header, newline, rest = hlo.partition("\n")
    return _with_meshes(module, header) + signature.header_options() + newline + rest


def _release_hint(message: str) -> str:
    """What to hand over when the text may come from a jax release whose StableHLO this jaxlib does not know."""
    if not any(word in message for word in ("unknown", "custom op", "undefined", "invalid", "expected")):
        return ""
    return (f" (read with {jaxlib_api.jax_version_text()}'s MLIR, which knows the StableHLO its own release "
            "writes: text from a newer jax may use forms it does not know. lowered.as_text(dialect='hlo') "
            "and XLA's dump read from any release)")  # fmt: skip


def _with_meshes(module: Any, header: str) -> str:
    """The header with the module's `sdy.mesh` declarations as its `xla.sdy.meshes` frontend attribute, where
    the converted header lacks them (jaxlib 0.12's export keeps the Shardy shardings that name `@mesh`, not
    the mesh)."""
    if MESHES in header:
        return header
    declared = [op for op in module.body.operations if op.operation.name == "sdy.mesh"]
    meshes = [f"{op.attributes['sym_name'].value} = {op.attributes['mesh']}" for op in declared
              if "sym_name" in op.attributes and "mesh" in op.attributes]  # fmt: skip
    if not meshes:
        return header
    entry = f"{MESHES}={{{', '.join(meshes)}}}"
    if _FRONTEND_ATTRIBUTES in header:
        return header.replace(_FRONTEND_ATTRIBUTES, f"{_FRONTEND_ATTRIBUTES}{entry}, ", 1)
    return f"{header}, {_FRONTEND_ATTRIBUTES}{entry}}}"


def _jaxlib(text: str, source: str) -> tuple[Any, Any]:
    """jaxlib's MLIR bindings and JAX's dialect registry."""
    try:
        from jax._src.interpreters import mlir as jax_mlir
        from jaxlib.mlir import ir
    except ImportError:
        raise _error(
            text,
            1,
            1,
            "this is StableHLO text (what lowered.as_text() prints); reading it needs jaxlib (pip install "
            "'spmd-planner[jax]'). Without it, hand over lowered.as_text(dialect='hlo') or XLA's dump",
            source,
        ) from None
    return ir, jax_mlir


def main_function(module: Any) -> Any:
    """The module's `func.func @main`, the entry JAX compiles, or None."""
    return next((op for op in module.body.operations if _symbol(op) == "main"), None)


def _entry_signature(ir: Any, module: Any, text: str, source: str) -> EntrySignature:
    main = main_function(module)
    if main is None:
        raise _error(text, 1, 1, "StableHLO text has no @main function, the entry JAX compiles", source)
    attributes = main.attributes
    function_type = attributes["function_type"].value
    result_attrs = _dicts(attributes, "res_attrs", len(function_type.results))
    argument_attrs = _dicts(attributes, "arg_attrs", len(function_type.inputs))
    num_partitions = None
    if "mhlo.num_partitions" in module.operation.attributes:
        num_partitions = int(module.operation.attributes["mhlo.num_partitions"].value)

    def ranks(types: Any) -> tuple[int, ...]:
        return tuple(ir.RankedTensorType(t).rank if jaxlib_api.is_ranked_tensor(ir, t) else 0 for t in types)

    return EntrySignature(
        results_sharded=tuple(_sharded(d) for d in result_attrs),
        result_ranks=ranks(function_type.results),
        arguments_sharded=tuple(_sharded(d) for d in argument_attrs),
        argument_ranks=ranks(function_type.inputs),
        num_partitions=num_partitions,
    )


def _symbol(op: Any) -> str | None:
    if op.operation.name != "func.func" or "sym_name" not in op.attributes:
        return None
    return str(op.attributes["sym_name"].value)


def _dicts(attributes: Any, key: str, count: int) -> list[Any]:
    """The per-argument or per-result attribute dictionaries (absent: none carries any)."""
    if key not in attributes:
        return [None] * count
    return list(attributes[key])


def _sharded(dictionary: Any) -> bool:
    return dictionary is not None and any(name in dictionary for name in SHARDING_ATTRIBUTES)


def _position(location: str) -> tuple[int, int]:
    found = _LOCATION.search(location)
    return (int(found.group(1)), int(found.group(2))) if found else (1, 1)


def _error(text: str, line: int, column: int, message: str, source: str) -> HloParseError:
    lines = text.splitlines()
    line_text = lines[line - 1] if 0 < line <= len(lines) else ""
    return HloParseError(message, line, column, line_text, source)
