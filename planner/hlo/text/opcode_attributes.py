"""Which `key=value` attributes each opcode takes, and what their values look like, as XLA's parser decides.

XLA's parser refuses an attribute its opcode does not know ("unexpected
attribute") and one the opcode needs but lacks ("attribute ... is expected but
not seen"). The table is jaxlib 0.7.1's: every opcode takes the common ones
(sharding, metadata, ...) plus its own, read from that parser's error
messages. The checks here see only the opcode and the attributes (so a
parser checks them once per spelling): a conditional takes either
true/false computations (on a pred) or `branch_computations` (on an s32),
and a broadcast may leave out `dimensions` (of a scalar).

Values XLA types more strictly than `attributes.READERS` are checked from
their text: metadata fields (`metadata=` and inside shardings), `window=`,
`outfeed_shape=`; and the module header's attributes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from planner.errors import HloParseError
from planner.hlo.ir.module import Attribute
from planner.hlo.ir.shapes import Shape, parse_shape
from planner.scanner import Cursor
from planner.sharding.hlo_sharding import HloSharding

COMMON = frozenset(
    "backend_config control-predecessors frontend_attributes metadata origin parameter_replication sharding "
    "statistics".split()
)

# opcode -> its own attributes, as written by XLA ("key1 key2 ..."); required ones carry a trailing '!'.
_OWN = {
    "algorithm!": "rng-bit-generator",
    "cross_program_prefetch_index": "copy-start",
    "delta!": "rng-get-and-update-state",
    # A broadcast of a scalar may leave `dimensions` out (the shape checks catch any other).
    "dimensions": "broadcast",
    "dimensions!": "concatenate get-dimension-size reverse set-dimension-size transpose",
    "distribution!": "rng",
    "domain!": "domain",
    "dynamic_slice_sizes!": "dynamic-slice",
    "index!": "get-tuple-element",
    "infeed_config": "infeed",
    "inferred_dimension": "reshape",
    "iota_dimension!": "iota",
    "lower": "cholesky",
    "padding!": "pad",
    "result_accuracy": "cbrt cosine erf exponential exponential-minus-one log log-plus-one logistic rsqrt sine sqrt "
    "tan tanh",
    "slice!": "slice",
    "body! condition!": "while",
    "channel_id is_host_transfer": "recv recv-done send send-done",
    "channel_id replica_groups!": "collective-broadcast",
    "dimensions to_apply!": "map",
    "dimensions! to_apply!": "reduce",
    "direction! type": "compare",
    "epsilon! feature_index!": "batch-norm-grad batch-norm-inference batch-norm-training",
    "exponent_bits! mantissa_bits!": "reduce-precision",
    "fft_length! fft_type!": "fft",
    "is_composite to_apply!": "call",
    "is_stable k! largest": "topk",
    "outfeed_config outfeed_shape": "outfeed",
    "to_apply! window": "reduce-window",
    "calls! kind! output_to_operand_aliasing": "fusion",
    "channel_id dimensions replica_groups": "ragged-all-to-all",
    "channel_id slice_sizes source_target_pairs!": "collective-permute collective-permute-start",
    "dimensions! is_stable to_apply!": "sort",
    "scatter! select! window": "select-and-scatter",
    "channel_id constrain_layout dimensions replica_groups": "all-to-all",
    "left_side lower transpose_a unit_diagonal": "triangular-solve",
    "batch_group_count dim_labels! feature_group_count operand_precision window": "convolution",
    "channel_id constrain_layout dimensions! replica_groups use_global_device_ids": "all-gather all-gather-start",
    "algorithm lhs_batch_dims lhs_contracting_dims operand_precision rhs_batch_dims rhs_contracting_dims": "dot "
    "scaled-dot",
    "channel_id constrain_layout mode replica_groups to_apply! use_global_device_ids": "all-reduce all-reduce-start",
    "channel_id constrain_layout dimensions! mode replica_groups to_apply! use_global_device_ids": "reduce-scatter",
    "lhs_batch_dims lhs_contracting_dims lhs_ragged_dims operand_precision rhs_batch_dims rhs_contracting_dims "
    "rhs_group_dims": "ragged-dot",
    "collapsed_slice_dims! index_vector_dim! indices_are_sorted offset_dims! operand_batching_dims slice_sizes! "
    "start_index_map! start_indices_batching_dims": "gather",
    "index_vector_dim! indices_are_sorted input_batching_dims inserted_window_dims! scatter_dims_to_operand_dims! "
    "scatter_indices_batching_dims to_apply! unique_indices update_window_dims!": "scatter",
    "api_version batch_group_count called_computations custom_call_has_side_effect custom_call_target! dim_labels "
    "feature_group_count literal operand_layout_constraints operand_precision output_to_operand_aliasing "
    "padding_type schedule to_apply window": "custom-call",
    "async_execution_thread calls": "async-start async-update async-done",
    # On a pred, true and false computations; on an s32, branch_computations (see _names_problem).
    "branch_computations false_computation true_computation": "conditional",
}
_ALLOWED: dict[str, frozenset[str]] = {}
_REQUIRED: dict[str, tuple[str, ...]] = {}
for _keys, _opcodes in _OWN.items():
    for _opcode in _opcodes.split():
        _ALLOWED[_opcode] = COMMON | {k.rstrip("!") for k in _keys.split()}
        _REQUIRED[_opcode] = tuple(k.rstrip("!") for k in _keys.split() if k.endswith("!"))
# Every key some opcode takes. A key outside it is not misplaced but new: XLA versions after jaxlib 0.7.1
# add attributes (the corpus's JAX dumps come from a newer XLA), and an attribute the planner does not
# model is kept verbatim rather than refused. A known key on the wrong opcode is refused, as XLA does.
KNOWN_KEYS = frozenset(k for allowed in _ALLOWED.values() for k in allowed)


def attribute_problem(
    opcode: str, attributes: tuple[Attribute, ...], text: str | None = None
) -> tuple[str, str | None] | None:
    """(why, the offending key or None) when XLA's parser would refuse these attributes on `opcode`.

    `text`, the attributes as written, keys a cache: a parser asks once per spelling, and the
    answer depends on the opcode and the text alone.
    """
    if text is None:
        return _names_problem(opcode, tuple(a.key for a in attributes)) or values_problem(attributes)
    try:
        return _BY_TEXT[opcode, text]
    except KeyError:
        if len(_BY_TEXT) >= 1 << 16:
            _BY_TEXT.clear()
        problem = _BY_TEXT[opcode, text] = attribute_problem(opcode, attributes)
        return problem


_BY_TEXT: dict[tuple[str, str], tuple[str, str | None] | None] = {}


def values_problem(attributes: tuple[Attribute, ...]) -> tuple[str, str] | None:
    """A value XLA reads more strictly than `attributes.READERS` and would refuse (the same for every opcode)."""
    for a in attributes:
        check = _VALUE_CHECKS.get(a.key)
        if check is not None:
            problem = check(a)
            if problem:
                return f"bad {a.key}: {problem}", a.key
    return None


@lru_cache(maxsize=4096)
def _names_problem(opcode: str, keys: tuple[str, ...]) -> tuple[str, str | None] | None:
    allowed, required = _ALLOWED.get(opcode, COMMON), _REQUIRED.get(opcode, ())
    for key in keys:
        if key not in allowed and key in KNOWN_KEYS:
            own = ", ".join(sorted(allowed - COMMON))
            return (
                f"{opcode} takes no attribute '{key}' (it takes {own + ' and ' if own else 'only '}the common ones)",
                key,
            )
    missing = [k for k in required if k not in keys]
    if missing:
        return f"{opcode} needs {' and '.join(f'{k}=' for k in missing)}", None
    if opcode == "conditional" and ("branch_computations" in keys) == ("true_computation" in keys):
        return "conditional needs true_computation= and false_computation=, or branch_computations=", None
    return None


# --- values --------------------------------------------------------------------------------------

_METADATA_STRINGS = frozenset("op_type op_name source_file deduplicated_name scheduling_name".split())
_METADATA_INT32 = frozenset("source_line source_end_line source_column source_end_column".split())
# Newer XLA adds `stack_frame_id=N` (into debug tables jaxlib 0.7.1 cannot read; `compat` strips both).
_METADATA_NEWER = frozenset({"stack_frame_id"})
_METADATA_FIELD = re.compile(r'\s*(,\s*)?([A-Za-z_][\w\-]*)=("(?:[^"\\]|\\.)*"|\{[^{}]*\}|[^\s,{}"]+)\s*')


@lru_cache(maxsize=4096)
def metadata_problem(text: str) -> str | None:
    """What XLA's parser refuses in `{op_name="..." source_line=N ...}`: unknown, repeated or mistyped fields."""
    body, seen, pos = text.strip(), set[str](), 1
    while pos < len(body) - 1:
        m = _METADATA_FIELD.match(body, pos)
        if m is None or m.end() == pos:
            return f"metadata {body} does not read as key=value fields"
        key, value = m.group(2), m.group(3)
        if key in seen:
            return f"metadata field '{key}' is given twice"
        seen.add(key)
        if key in _METADATA_STRINGS and not value.startswith('"'):
            return f"metadata field '{key}' needs a quoted string, not {value}"
        if key in _METADATA_INT32 | _METADATA_NEWER and not (
            re.fullmatch(r"-?\d+", value) and -(2**31) <= int(value) < 2**31
        ):
            return f"metadata field '{key}' needs a 32-bit integer, not {value}"
        if key == "profile_type" and not value.startswith("{"):
            return f"metadata field 'profile_type' needs {{...}}, not {value}"
        if key not in _METADATA_STRINGS | _METADATA_INT32 | _METADATA_NEWER | {"profile_type"}:
            return f"unknown metadata field '{key}'"
        pos = m.end()
    return None


def _sharding_metadata(sharding: HloSharding) -> tuple[str, ...]:
    return sharding.metadata + tuple(text for e in sharding.elements for text in e.metadata)


@lru_cache(maxsize=1024)
def shape_attribute_problem(text: str) -> str | None:
    """An attribute XLA reads as a shape (`outfeed_shape=`)."""
    cursor = Cursor(text)
    try:
        parse_shape(cursor, {}, "a shape")
    except HloParseError as e:
        return e.message
    return None if cursor.at_end() else f"unexpected {cursor.describe_next()} after the shape"


MODULE_ATTRIBUTES = frozenset(
    "alias_passthrough_params allow_spmd_sharding_propagation_to_output allow_spmd_sharding_propagation_to_parameters "
    "buffer_donor entry_computation_layout frontend_attributes input_output_alias is_scheduled num_partitions "
    "origin_recovery_table replica_count".split()
)


def module_attribute_problem(key: str, text: str, shapes: dict[str, Shape]) -> tuple[str, int] | None:
    """(why, offset in `text`) when a header attribute is one XLA's parser refuses; `shapes` caches shape texts."""
    # A header key jaxlib 0.7.1 does not know is kept verbatim, as a newer XLA may write it (see KNOWN_KEYS).
    if key != "entry_computation_layout":
        return None
    # `{(parameter shapes)->result shape}`, each shape as XLA reads it (tuple elements validated).
    cursor = Cursor(text)
    try:
        cursor.expect("{", "to open entry_computation_layout")
        cursor.expect("(", "before the parameter shapes")
        if not cursor.try_literal(")"):
            while True:
                parse_shape(cursor, shapes, "a parameter shape")
                if cursor.try_literal(")"):
                    break
                cursor.expect(",", "or ')' between parameter shapes")
        cursor.expect("->", "before the result shape")
        parse_shape(cursor, shapes, "the result shape")
        cursor.expect("}", "to close entry_computation_layout")
    except HloParseError as e:
        return f"bad entry_computation_layout: {e.message}", cursor.pos
    return None


_WINDOW_FIELD = re.compile(
    r"\s*(size|stride|lhs_dilate|rhs_dilate|rhs_reversal|pad)=(-?\d+(?![\dx_])|\d+(?:x\d+)+(?![\dx_])|"
    r"-?\d+_-?\d+(?:x-?\d+_-?\d+)*(?![\dx_]))\s*"
)


@lru_cache(maxsize=1024)
def window_problem(text: str) -> str | None:
    """`window={size=2x2 stride=1x1 pad=0_1x1_0 ...}` as XLA's parser reads it: each field once, all as long as size."""
    body, pos, counts = text.strip(), 1, {}
    while pos < len(body) - 1:
        m = _WINDOW_FIELD.match(body, pos)
        if m is None or m.end() == pos:
            return f"window {body} does not read as fields like size=2x2 stride=1x1 pad=0_0x1_1"
        key, value = m.groups()
        if key in counts:
            return f"window field '{key}' is given twice"
        if (key == "pad") != ("_" in value):
            return f"window field '{key}={value}' is not written as " + ("low_high pairs" if key == "pad" else "NxM")
        counts[key] = value.count("x") + 1
        pos = m.end()
    size = counts.get("size", 0)
    odd = next((k for k, n in counts.items() if n != size), None)
    return f"window field '{odd}' has {counts[odd]} dims, size has {size}" if odd else None


_VALUE_CHECKS: dict[str, Callable[[Attribute], str | None]] = {
    "metadata": lambda a: metadata_problem(a.text),
    "sharding": lambda a: (
        next(filter(None, map(metadata_problem, _sharding_metadata(a.value))), None)
        if isinstance(a.value, HloSharding)
        else None
    ),
    "outfeed_shape": lambda a: shape_attribute_problem(a.text),
    "window": lambda a: window_problem(a.text),
}
