"""Typed values of the HLO attributes the planner reads.

Each attribute is read as raw text first (so an attribute we do not model is
kept verbatim), then interpreted by the reader registered for its key in
`READERS`. A reader runs on a cursor at the value's first character, so its
errors point into the original file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.hlo.ir.frontend_attributes import read_frontend_attributes
from planner.scanner import Cursor
from planner.sharding.text import parse_sharding_at

_INT_LIST = re.compile(r"\{\s*(-?\d+(?:\s*,\s*-?\d+)*)?\s*\}")
_WORD = re.compile(r"[A-Za-z_][\w\-]*")
_BOOL = re.compile(r"true|false")
_SLICE_DIM = re.compile(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]")
_SLICE_BOUNDS = re.compile(r"\[(-?\d+):(-?\d+)(?::(-?\d+))?\]")
_PLAIN_SLICE = re.compile(rf"\{{{_SLICE_BOUNDS.pattern}(?:, {_SLICE_BOUNDS.pattern})*\}}")
_PADDING = re.compile(r"-?\d+_-?\d+(?:_-?\d+)?(?:x-?\d+_-?\d+(?:_-?\d+)?)*")
_DIM_LABELS = re.compile(r"([\w?]+)_([\w?]+)->([\w?]+)")
_WINDOW_FIELD = re.compile(r"(size|stride|pad|lhs_dilate|rhs_dilate|rhs_reversal)=([\d_x\-]+)")
_METADATA_FIELD = re.compile(r'([a-z_]+)=("(?:[^"\\]|\\.)*"|[^\s},"][^\s},]*)')
# `{field field ...}` read in one match; XLA allows a comma before each field.
_METADATA = re.compile(r'\{\s*(?:,?\s*[a-z_]+=(?:"(?:[^"\\]|\\.)*"|[^\s},"][^\s},]*)\s*)*\}')


@dataclass(frozen=True, slots=True)
class Raw:
    """An attribute the planner does not model, kept exactly as written."""

    text: str


@dataclass(frozen=True, slots=True)
class SliceDim:
    start: int
    limit: int
    stride: int = 1


@dataclass(frozen=True, slots=True)
class PadDim:
    low: int
    high: int
    interior: int = 0


@dataclass(frozen=True, slots=True)
class WindowDim:
    size: int
    stride: int = 1
    pad_low: int = 0
    pad_high: int = 0
    lhs_dilate: int = 1
    rhs_dilate: int = 1
    reversal: bool = False


@dataclass(frozen=True, slots=True)
class ConvDimLabels:
    """`dim_labels=b01f_01io->b01f`: which dim is batch/feature/spatial.

    For the input and output, `b` is batch, `f` feature and digits spatial
    dims; for the kernel, `i`/`o` are input/output features.
    """

    lhs: str
    rhs: str
    out: str

    def spatial_dims(self, labels: str) -> tuple[int, ...]:
        digits = sorted((c, i) for i, c in enumerate(labels) if c.isdigit())
        return tuple(i for _, i in digits)


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """Device groups of a collective, from `{{0,1},{2,3}}`, `[2,4]<=[8]` or `mesh['x'=2,'y'=4] {'y'}`."""

    groups: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Metadata:
    """`metadata={op_type=... op_name=... source_file=... source_line=...}`."""

    fields: tuple[tuple[str, str], ...]

    def get(self, key: str) -> str | None:
        for k, v in self.fields:
            if k == key:
                return v[1:-1] if v.startswith('"') else v
        return None

    @property
    def op_name(self) -> str | None:
        return self.get("op_name")

    @property
    def source_file(self) -> str | None:
        return self.get("source_file")

    @property
    def source_line(self) -> int | None:
        line = self.get("source_line")
        return int(line) if line is not None and line.lstrip("-").isdigit() else None


@dataclass(frozen=True, slots=True)
class ComputationRefs:
    """Names of called computations (`to_apply=%f` or `calls={%a, %b}`)."""

    names: tuple[str, ...]


def read_int(cursor: Cursor) -> int:
    return cursor.parse_int()


def read_int_list(cursor: Cursor) -> tuple[int, ...]:
    m = cursor.match(_INT_LIST, "a list of integers like {0,1}")
    return tuple(map(int, m.group(1).split(","))) if m.group(1) else ()


def read_bool(cursor: Cursor) -> bool:
    return cursor.match(_BOOL, "true or false").group(0) == "true"


def read_bool_list(cursor: Cursor) -> tuple[bool, ...]:
    """`{true,false}` (one flag per entry parameter or output), or one flag."""
    if cursor.peek() != "{":
        return (read_bool(cursor),)
    cursor.expect("{")
    flags: list[bool] = []
    if not cursor.try_literal("}"):
        while True:
            flags.append(read_bool(cursor))
            if cursor.try_literal("}"):
                break
            cursor.expect(",", "or '}' in the list of flags")
    return tuple(flags)


def read_word(cursor: Cursor) -> str:
    if cursor.peek() == '"':
        return cursor.parse_string()[1:-1]
    return cursor.match(_WORD, "a word").group(0)


def read_computation(cursor: Cursor) -> ComputationRefs:
    return ComputationRefs((cursor.parse_name("a computation name"),))


def read_computation_list(cursor: Cursor) -> ComputationRefs:
    if cursor.peek() != "{":
        return read_computation(cursor)
    cursor.expect("{")
    names: list[str] = []
    if not cursor.try_literal("}"):
        while True:
            names.append(cursor.parse_name("a computation name"))
            if cursor.try_literal("}"):
                break
            cursor.expect(",", "or '}' in computation list")
    return ComputationRefs(tuple(names))


def read_slice(cursor: Cursor) -> tuple[SliceDim, ...]:
    plain = _PLAIN_SLICE.match(cursor.text, cursor.skip_space())
    if plain is not None:
        # As XLA prints it, `{[0:8], [0:4:2]}`: read in one step.
        cursor.pos = plain.end()
        return tuple(SliceDim(int(a), int(b), int(c or 1)) for a, b, c in _SLICE_BOUNDS.findall(plain.group(0)))
    cursor.expect("{", "to open slice={...}")
    dims: list[SliceDim] = []
    if not cursor.try_literal("}"):
        while True:
            m = cursor.match(_SLICE_DIM, "a slice dimension like [0:8] or [0:8:2]")
            dims.append(SliceDim(int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)))
            if cursor.try_literal("}"):
                break
            cursor.expect(",", "or '}' in slice")
    return tuple(dims)


def read_padding(cursor: Cursor) -> tuple[PadDim, ...]:
    m = cursor.match(_PADDING, "padding like 0_0x1_2 or 0_0_1")
    return tuple(PadDim(*map(int, _split_pad(p))) for p in m.group(0).split("x"))


def _split_pad(text: str) -> list[str]:
    # "-1_2" splits into ["-1", "2"]; a leading minus belongs to the number.
    return re.findall(r"-?\d+", text)


def read_window(cursor: Cursor) -> tuple[WindowDim, ...]:
    cursor.expect("{", "to open window={...}")
    fields: dict[str, list[str]] = {}
    while not cursor.try_literal("}"):
        start = cursor.skip_space()
        m = cursor.match(_WINDOW_FIELD, "a window field (size, stride, pad, lhs_dilate, rhs_dilate, rhs_reversal)")
        values = m.group(2).split("x")
        if fields and len(values) != len(next(iter(fields.values()))):
            cursor.fail(f"window field '{m.group(1)}' has {len(values)} dims, others have "
                        f"{len(next(iter(fields.values())))}", start)  # fmt: skip
        fields[m.group(1)] = values
    if not fields:
        return ()
    rank = len(next(iter(fields.values())))
    dims = []
    for i in range(rank):
        pad = _split_pad(fields["pad"][i]) if "pad" in fields else ["0", "0"]
        dims.append(
            WindowDim(
                size=int(fields.get("size", ["1"] * rank)[i]),
                stride=int(fields.get("stride", ["1"] * rank)[i]),
                pad_low=int(pad[0]),
                pad_high=int(pad[1]) if len(pad) > 1 else 0,
                lhs_dilate=int(fields.get("lhs_dilate", ["1"] * rank)[i]),
                rhs_dilate=int(fields.get("rhs_dilate", ["1"] * rank)[i]),
                reversal=fields.get("rhs_reversal", ["0"] * rank)[i] == "1",
            )
        )
    return tuple(dims)


def read_dim_labels(cursor: Cursor) -> ConvDimLabels:
    m = cursor.match(_DIM_LABELS, "convolution dim_labels like b01f_01io->b01f")
    return ConvDimLabels(m.group(1), m.group(2), m.group(3))


def read_replica_groups(cursor: Cursor) -> ReplicaGroups:
    if cursor.text.startswith("mesh", cursor.skip_space()):
        # Over mesh axes, as newer XLA writes a shard_map's collectives: mesh['fsdp'=2,'tp'=4] {'tp'}.
        from planner.sharding.named_text import read_mesh_replica_groups

        return ReplicaGroups(read_mesh_replica_groups(cursor))
    if cursor.peek() == "[":
        # Iota form: [num_groups,group_size]<=[reshape]T(perm).
        from planner.sharding.text import parse_tile_assignment_at

        tiles = parse_tile_assignment_at(cursor)
        array = tiles.array()
        if array.ndim != 2:
            cursor.fail(f"replica groups need 2 dims [groups,size], got {list(tiles.dims)}")
        return ReplicaGroups(tuple(tuple(int(d) for d in row) for row in array))
    cursor.expect("{", "to open replica_groups={...}")
    groups: list[tuple[int, ...]] = []
    if not cursor.try_literal("}"):
        while True:
            groups.append(read_int_list(cursor))
            if cursor.try_literal("}"):
                break
            cursor.expect(",", "or '}' in replica_groups")
    return ReplicaGroups(tuple(groups))


def read_metadata(cursor: Cursor) -> Metadata:
    start = cursor.skip_space()
    whole = _METADATA.match(cursor.text, start)
    if whole is None:
        # Point at the first field that does not read.
        if cursor.text[start : start + 1] != "{":
            cursor.fail(f"expected '{{' to open metadata, found {cursor.describe_next()}")
        cursor.pos = start + 1
        while cursor.try_match(_METADATA_FIELD):
            pass
        if not cursor.try_literal("}"):
            cursor.fail("expected a metadata field like op_name=\"...\" or '}'")
        cursor.fail("malformed metadata", start)
    cursor.pos = whole.end()
    return Metadata(tuple(_METADATA_FIELD.findall(cursor.text, start + 1, whole.end() - 1)))


def read_backend_config(cursor: Cursor) -> Any:
    """Returns parsed JSON when the config is JSON (quoted or bare), else the text."""
    if cursor.peek() == '"':
        text = json.loads(cursor.parse_string())
    else:
        start = cursor.pos
        from planner.scanner import skip_balanced

        skip_balanced(cursor, "backend_config")
        text = cursor.text[start : cursor.pos]
    if text.strip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


Reader = Callable[[Cursor], Any]

_INT_LIST_KEYS = (
    "dimensions dynamic_slice_sizes lhs_contracting_dims rhs_contracting_dims lhs_batch_dims rhs_batch_dims "
    "offset_dims collapsed_slice_dims start_index_map slice_sizes operand_batching_dims "
    "start_indices_batching_dims update_window_dims inserted_window_dims scatter_dims_to_operand_dims "
    "input_batching_dims scatter_indices_batching_dims lhs_ragged_dims rhs_group_dims fft_length"
)
_INT_KEYS = (
    "index index_vector_dim iota_dimension feature_group_count batch_group_count channel_id "
    "exponent_bits mantissa_bits split_dimension concat_dimension num_partitions replica_count"
)
_BOOL_KEYS = (
    "custom_call_has_side_effect is_stable indices_are_sorted unique_indices use_global_device_ids "
    "constrain_layout is_host_transfer is_cross_program_prefetch largest is_scheduled alias_passthrough_params"
)
_WORD_KEYS = "custom_call_target direction algorithm comparison_type distribution fft_type api_version rng_algorithm"
_COMPUTATION_KEYS = "to_apply condition body true_computation false_computation select scatter"

READERS: dict[str, Reader] = {
    **{k: read_int_list for k in _INT_LIST_KEYS.split()},
    **{k: read_int for k in _INT_KEYS.split()},
    **{k: read_bool for k in _BOOL_KEYS.split()},
    **{k: read_word for k in _WORD_KEYS.split()},
    **{k: read_computation for k in _COMPUTATION_KEYS.split()},
    "calls": read_computation_list,
    "branch_computations": read_computation_list,
    "called_computations": read_computation_list,
    "allow_spmd_sharding_propagation_to_output": read_bool_list,
    "allow_spmd_sharding_propagation_to_parameters": read_bool_list,
    "slice": read_slice,
    "padding": read_padding,
    "window": read_window,
    "dim_labels": read_dim_labels,
    "replica_groups": read_replica_groups,
    "source_target_pairs": read_replica_groups,
    "metadata": read_metadata,
    "frontend_attributes": read_frontend_attributes,
    "backend_config": read_backend_config,
    "sharding": parse_sharding_at,
}

# Attributes whose value names called computations.
COMPUTATION_ATTRIBUTES = frozenset(_COMPUTATION_KEYS.split()) | {"calls", "branch_computations", "called_computations"}

# Readers that some values, delimited already, fit whole in one regex: for such a value the
# reader would read all of it, with the result each of these gives (None: read it the usual way).
_WHOLE_INT = re.compile(r"-?\d+")
_WHOLE_NAME = re.compile(r"%?([A-Za-z_0-9][\w.\-]*)")


def _whole_int(text: str) -> int | None:
    return int(text) if _WHOLE_INT.fullmatch(text) else None


def _whole_int_list(text: str) -> tuple[int, ...] | None:
    m = _INT_LIST.fullmatch(text)
    if m is None:
        return None
    return tuple(map(int, m.group(1).split(","))) if m.group(1) else ()


def _whole_computation(text: str) -> ComputationRefs | None:
    m = _WHOLE_NAME.fullmatch(text)
    return ComputationRefs((m.group(1),)) if m else None


def _whole_word(text: str) -> str | None:
    return text if _WORD.fullmatch(text) else None


def _whole_metadata(text: str) -> Metadata | None:
    if _METADATA.fullmatch(text) is None:
        return None
    return Metadata(tuple(_METADATA_FIELD.findall(text, 1, len(text) - 1)))


WHOLE_VALUE_READERS: dict[Reader, Callable[[str], Any]] = {
    read_int: _whole_int,
    read_int_list: _whole_int_list,
    read_computation: _whole_computation,
    read_word: _whole_word,
    read_metadata: _whole_metadata,
}
