"""The few jaxlib entry points the planner uses, found where each jaxlib release keeps them.

jaxlib moved its HLO bindings between releases: 0.7.1 keeps `HloPrintOptions`,
`hlo_module_from_text` and `XlaComputation` in `jax._src.lib._jax`; 0.12 moved them to
`jaxlib._hlo` (JAX's own `Lowered.as_text(dialect="hlo")` reads them there). The StableHLO <->
HLO converters (`_jax.mlir`) stayed. Text handed to an older XLA drops what its parser does
not read yet (`planner.hlo.text.compat`). A binding that neither place has is a `PlanningError`
naming the installed jax and what to hand over instead, never an AttributeError.
"""

from __future__ import annotations

import re
from typing import Any

from planner.errors import JaxlibRefusedText, PlanningError
from planner.hlo.text.compat import for_jaxlib_0_7

# The jaxlib releases that still need the text without debug-info tables.
_OLD_TEXT_BEFORE = (0, 8)
# How XLA's HLO parser says where it stopped: `was parsing 31:75: error: unexpected attribute "order".
# Allowed attributes: ...`; the list of what it allows is left out of the reason.
_PARSER_REFUSAL = re.compile(r"was parsing (\d+):(\d+): error: ([^\n]*?)(?:\. Allowed attributes:[^\n]*)?$", re.M)


def jaxlib_version() -> tuple[int, ...]:
    import jaxlib

    return tuple(int(p) for p in jaxlib.__version__.split(".")[:3] if p.isdigit())


def jax_version_text() -> str:
    try:
        import jax

        return f"jax {jax.__version__}"
    except ImportError:
        return "no jax"


def hlo_bindings() -> Any:
    """The module holding `HloPrintOptions`, `hlo_module_from_text` and `XlaComputation`."""
    try:
        from jaxlib import _hlo  # type: ignore[attr-defined]  # jaxlib >= 0.8

        return _hlo
    except ImportError:
        pass
    from jax._src.lib import _jax

    if hasattr(_jax, "hlo_module_from_text"):
        return _jax
    raise PlanningError(
        f"this jaxlib ({jax_version_text()}) has no HLO text bindings the planner knows (neither "
        "jaxlib._hlo nor jax._src.lib._jax.hlo_module_from_text): hand over XLA's dump or "
        "lowered.as_text(dialect='hlo') and plan without --verify, or install jax 0.7.1 to 0.12"
    )


def mlir_bindings() -> Any:
    """jaxlib's StableHLO <-> HLO converters (`hlo_to_stablehlo`, `mlir_module_to_xla_computation`)."""
    from jax._src.lib import _jax

    converters = getattr(_jax, "mlir", None)
    if converters is None or not hasattr(converters, "hlo_to_stablehlo"):
        raise PlanningError(f"this jaxlib ({jax_version_text()}) has no StableHLO converter the planner knows")
    return converters


def text_for_jaxlib(text: str) -> str:
    """HLO text as the installed jaxlib's parser reads it."""
    return for_jaxlib_0_7(text) if jaxlib_version() < _OLD_TEXT_BEFORE else text


def hlo_proto(text: str) -> bytes:
    """The serialized HloModuleProto of HLO `text`, parsed by the installed XLA.

    Raises `JaxlibRefusedText` when XLA's parser refuses the text (a form a newer XLA writes), with its reason
    and the line it stopped on.
    """
    readable = text_for_jaxlib(text)
    try:
        module = hlo_bindings().hlo_module_from_text(readable)
    except Exception as e:  # jaxlib's XlaRuntimeError, whose class each release keeps elsewhere
        refusal = _PARSER_REFUSAL.search(str(e))
        if refusal is None:
            raise
        line, column = int(refusal.group(1)), int(refusal.group(2))
        lines = readable.splitlines()
        line_text = lines[line - 1] if 0 < line <= len(lines) else ""
        raise JaxlibRefusedText(refusal.group(3), line, column, line_text) from None
    return bytes(module.as_serialized_hlo_module_proto())


def hlo_to_stablehlo(text: str) -> bytes:
    """jaxlib's import of HLO `text` as StableHLO (bytecode or text, as the converter returns it)."""
    return bytes(mlir_bindings().hlo_to_stablehlo(hlo_proto(text)))


def stablehlo_to_computation(mlir: bytes | str) -> Any:
    """An XlaComputation of a StableHLO module: the export jaxlib's compile path runs."""
    return mlir_bindings().mlir_module_to_xla_computation(mlir, use_tuple_args=False, return_tuple=False)


def short_parsable_text(computation: Any, with_metadata: bool) -> str:
    """The computation's HLO text as `Lowered.as_text(dialect="hlo")` prints it."""
    options = hlo_bindings().HloPrintOptions.short_parsable()
    options.print_metadata = with_metadata
    # A sharding constraint's `unspecified_dims=[...]` (P.UNCONSTRAINED) lives in its backend_config, which
    # jaxlib 0.7.1's short_parsable leaves out (0.12's prints it, as XLA's dump does).
    options.print_backend_config = True
    return str(computation.as_hlo_module().to_string(options))


def is_ranked_tensor(ir: Any, value_type: Any) -> bool:
    """Whether an MLIR type is a ranked tensor, in the bindings of either jaxlib (`isinstance` class method
    before MLIR's Python bindings downcast types themselves)."""
    check = getattr(ir.RankedTensorType, "isinstance", None)
    if check is not None:
        return bool(check(value_type))
    return isinstance(value_type, ir.RankedTensorType)
