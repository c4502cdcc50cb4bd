"""What XLA:TPU's buffer assignment shares that XLA:CPU's does not, each read from XLA:TPU's own dumps of
MaxText's steps (`python -m fidelity.run_maxtext ... --keep-dumps`):

- A transpose of an entry parameter is a bitcast after layout assignment: it holds the parameter's buffer,
  so a scan's stacked weights (MaxText's `param_scan_axis=1`) cost nothing beside the parameter.
- Stacked f32 weights the loop reads only through a conversion to bf16 are converted once before the
  loop: the loop carries a bf16 copy, half the parameter's bytes.
- An all-reduce writes its result over its operand: a weight gradient's partial sums and their reduction
  are one allocation (on XLA:CPU, two).
- A loop body's gathered weight is freed after its last dot; on XLA:CPU it stays until the body's last
  weight-gradient partial sum is reduced.
"""

from __future__ import annotations

from allocations import allocating

from planner import parse_hlo
from planner.memory.communication import communication_buffers
from planner.memory.model import estimate_module
from planner.prepare import prepare
from planner.propagation import propagate
from planner.targets import backend

# A scan reading its stacked weights the way MaxText's mixed precision does: a layer sliced, cast to bf16 and
# used by a dot whose products the loop sums.
STACKED_WEIGHTS = """HloModule mixed, num_partitions=1

cond {
  p = (s32[], f32[4,1024,2048], bf16[1024,1024]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[4,1024,2048], bf16[1024,1024]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  w = f32[4,1024,2048] get-tuple-element(p), index=1
  acc = bf16[1024,1024] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  layer = f32[1,1024,2048] dynamic-slice(w, i, zero, zero), dynamic_slice_sizes={1,1024,2048}
  narrow = bf16[1,1024,2048] convert(layer)
  matrix = bf16[1024,2048] reshape(narrow)
  product = bf16[1024,1024] dot(matrix, matrix), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  sum = bf16[1024,1024] add(acc, product)
  one = s32[] constant(1)
  next = s32[] add(i, one)
  ROOT t = (s32[], f32[4,1024,2048], bf16[1024,1024]) tuple(next, w, sum)
}

ENTRY main {
  param = f32[1024,4,2048]{2,1,0} parameter(0)
  stacked = f32[4,1024,2048]{2,0,1} transpose(param), dimensions={1,0,2}
  zero = s32[] constant(0)
  start = bf16[] constant(0)
  acc = bf16[1024,1024] broadcast(start), dimensions={}
  init = (s32[], f32[4,1024,2048], bf16[1024,1024]) tuple(zero, stacked, acc)
  loop = (s32[], f32[4,1024,2048], bf16[1024,1024]) while(init), condition=cond, body=body
  ROOT out = bf16[1024,1024] get-tuple-element(loop), index=2
}
"""


def test_a_transposed_parameter_is_the_parameters_own_buffer_on_tpu() -> None:
    assert "stacked" not in allocating(STACKED_WEIGHTS, "v6e")
    # XLA:CPU's model keeps its own rule: the transpose is a buffer of its own.
    assert "stacked" in allocating(STACKED_WEIGHTS, "cpu")


def _half_precision_copies(target: str) -> list[int]:
    prepared = prepare(parse_hlo(STACKED_WEIGHTS), target)
    estimate = estimate_module(prepared.module, propagate(prepared), prepared.mesh, prepared.target)
    return [b.size_bytes for b in estimate.buffers if b.defined_by.endswith("at half precision")]


def test_stacked_weights_read_at_half_precision_are_carried_as_a_bf16_copy_on_tpu() -> None:
    assert _half_precision_copies("v6e") == [4 * 1024 * 2048 * 2]
    assert _half_precision_copies("cpu") == []


# A weight-gradient dot with the batch split over 4 devices and the result split on its rows: partial sums
# reduced, then sliced.
WEIGHT_GRADIENT = """HloModule gradient, num_partitions=4

ENTRY main {
  x = bf16[1024,2048]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  dy = bf16[1024,4096]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  dw = bf16[2048,4096]{1,0} dot(x, dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ROOT out = bf16[2048,4096]{1,0} copy(dw), sharding={devices=[4,1]<=[4]}
}
"""


def _kinds(text: str, target: str) -> list[str]:
    prepared = prepare(parse_hlo(text), target)
    module = prepared.module
    spans = communication_buffers(module, propagate(prepared), [module.entry_name], backend(target))
    return sorted(s.kind for s in spans.get(module.entry_name, []))


def test_an_all_reduce_writes_over_its_partial_sums_on_tpu() -> None:
    assert _kinds(WEIGHT_GRADIENT, "cpu") == ["all-reduced result", "result before reduction"]
    assert _kinds(WEIGHT_GRADIENT, "v6e") == ["result before reduction"]


# One scanned layer's backward: the weight gathered (FSDP over 4 devices) for dx, then the weight
# gradient's partial sums, reduced and sliced.
LAYER_BACKWARD = """HloModule layer, num_partitions=4

cond {
  p = (s32[], bf16[4,2048,4096], bf16[256,2048]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], bf16[4,2048,4096], bf16[256,2048]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  ws = bf16[4,2048,4096] get-tuple-element(p), index=1
  dy = bf16[256,2048] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  slice = bf16[1,2048,4096] dynamic-slice(ws, i, zero, zero), dynamic_slice_sizes={1,2048,4096}
  w = bf16[2048,4096] reshape(slice), sharding={devices=[4,1]<=[4]}
  dx = bf16[256,4096] dot(dy, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
  dw = bf16[2048,4096] dot(dy, dx), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
  one = s32[] constant(1)
  next = s32[] add(i, one)
  dw1 = bf16[1,2048,4096] reshape(dw)
  ws2 = bf16[4,2048,4096] dynamic-update-slice(ws, dw1, i, zero, zero)
  ROOT t = (s32[], bf16[4,2048,4096], bf16[256,2048]) tuple(next, ws2, dy)
}

ENTRY main {
  ws = bf16[4,2048,4096] parameter(0), sharding={devices=[1,4,1]<=[4]}
  dy = bf16[256,2048] parameter(1), sharding={devices=[4,1]<=[4]}
  zero = s32[] constant(0)
  init = (s32[], bf16[4,2048,4096], bf16[256,2048]) tuple(zero, ws, dy)
  loop = (s32[], bf16[4,2048,4096], bf16[256,2048]) while(init), condition=cond, body=body
  ROOT out = bf16[4,2048,4096] get-tuple-element(loop), index=1, sharding={devices=[1,4,1]<=[4]}
}
"""


def _gather_end(target: str) -> tuple[int, int]:
    prepared = prepare(parse_hlo(LAYER_BACKWARD), target)
    module = prepared.module
    body = next(c.name for c in module.computations if c.name.startswith("body"))
    spans = communication_buffers(module, propagate(prepared), [body], backend(target))[body]
    positions = {inst.name: k for k, inst in enumerate(module.computation(body).instructions)}
    gathered = [s for s in spans if s.kind == "gathered" and s.operand == "w"]
    assert len(gathered) == 1, spans
    return gathered[0].end, positions["dw"]


def test_a_gathered_weight_is_freed_after_its_dot_on_tpu_and_held_to_the_partial_sums_on_cpu() -> None:
    end, weight_gradient = _gather_end("v6e")
    assert end < weight_gradient
    end, weight_gradient = _gather_end("cpu")
    assert end >= weight_gradient
