"""What fusion leaves in memory: which values hold a buffer, how long fused reads keep their operands,
a shard_map's edges and body.

- XLA:TPU's and XLA:GPU's fusion computes a cheap producer again in each of its consumers
  (`InstructionFusion::IsExpensive`, with f32 exponentials, divides and square roots cheap on an
  accelerator): such a value holds no buffer, where XLA:CPU's model gives it one.
- A producer fused into a consumer far down the computation is read there: its operands stay live.
- A shard_map's edge custom-calls are views of their operands, and its body is inlined before buffers
  are assigned: the same bytes as the step written without the call.
"""

from __future__ import annotations

from allocations import allocating

from planner import parse_hlo
from planner.memory.model import estimate_module
from planner.memory.values import ValueModel, read_ends
from planner.prepare import prepare
from planner.propagation import propagate

SOFTMAX = """HloModule softmax, num_partitions=1

sum {
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT c = {t}[] add(a, b)
}

ENTRY main {
  logits = bf16[512,4096]{1,0} parameter(0)
  wide = {t}[512,4096]{1,0} convert(logits)
  zero = {t}[] constant(0)
  shift = {t}[512,4096]{1,0} broadcast(zero), dimensions={}
  centred = {t}[512,4096]{1,0} subtract(wide, shift)
  e = {t}[512,4096]{1,0} exponential(centred)
  total = {t}[512] reduce(e, zero), dimensions={1}, to_apply=sum
  scale = {t}[512,4096]{1,0} broadcast(total), dimensions={0}
  probs = {t}[512,4096]{1,0} divide(e, scale)
  back = {t}[512,4096]{1,0} multiply(centred, centred)
  narrow = bf16[512,4096]{1,0} convert(probs)
  narrow2 = bf16[512,4096]{1,0} convert(back)
  ROOT out = (bf16[512,4096]{1,0}, bf16[512,4096]{1,0}) tuple(narrow, narrow2)
}
"""


def _softmax(element_type: str) -> str:
    return SOFTMAX.replace("{t}", element_type)


def test_an_accelerator_recomputes_cheap_ops_and_f32_exponentials_in_each_consumer() -> None:
    tpu = allocating(_softmax("f32"), "v6e")
    # The subtract and the exponential each feed two fusions: recomputed there, no buffer of their own.
    assert "centred" not in tpu and "e" not in tpu
    cpu = allocating(_softmax("f32"), "cpu")
    assert {"centred", "e"} <= cpu


def test_an_accelerator_stores_a_bf16_exponential_read_twice() -> None:
    # Only f32 and f16 exponentials count as cheap (GpuInstructionFusion::IsExpensive).
    assert "e" in allocating(_softmax("bf16"), "v6e")


FAR_READ = """HloModule far_read, num_partitions=1

ENTRY main {
  a = f32[256,256]{1,0} parameter(0)
  d = f32[256,256]{1,0} dot(a, a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  n = f32[256,256]{1,0} negate(d)
  m = f32[256,256]{1,0} multiply(n, n)
  x = f32[256,256]{1,0} dot(a, a), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  y = f32[256,256]{1,0} dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  far = f32[256,256]{1,0} add(m, y)
  ROOT out = f32[256,256]{1,0} dot(far, a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_a_value_read_by_a_fused_chain_lives_until_the_chain_is_computed() -> None:
    prepared = prepare(parse_hlo(FAR_READ), "v6e")
    model = ValueModel(prepared.module, propagate(prepared), True)
    model.build()
    entry = prepared.module.entry
    positions = {inst.name: k for k, inst in enumerate(entry.instructions)}
    ends = read_ends(entry, model.fused, positions)
    # `n` and `m` are fused into `far`: `d` is read where `far` runs, after `x` and `y`.
    assert {("main", "n"), ("main", "m")} <= model.fused
    # So `d` is last read at `far`, after `x` and `y` are computed; on XLA:CPU's model, at `n`.
    assert max(ends[u] for u in entry.users("d")) == positions["far"] > positions["y"]
    assert max(read_ends(entry, set(), positions)[u] for u in entry.users("d")) == positions["n"]


# The step's entry up to the shard_map's body: its operand `t`, and both edges into the manual region.
_ENTRY_HEAD = """
ENTRY main {
  x = f32[131072,1024]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  w = f32[1024,1024]{1,0} parameter(1), sharding={replicated}
  t = f32[131072,1024]{1,0} exponential(x), sharding={devices=[8,1]<=[8]}
  to_local = f32[16384,1024]{1,0} custom-call(t), custom_call_target="SPMDFullToShardShape", sharding={manual}
  w_local = f32[1024,1024]{1,0} custom-call(w), custom_call_target="SPMDFullToShardShape", sharding={manual}
"""
_TO_GLOBAL = 'custom_call_target="SPMDShardToFullShape", sharding={devices=[8,1]<=[8]}'

MANUAL = f"""HloModule manual, num_partitions=8

body {{
  local = f32[16384,1024]{{1,0}} parameter(0), sharding={{manual}}
  w = f32[1024,1024]{{1,0}} parameter(1), sharding={{manual}}
  h = f32[16384,1024]{{1,0}} dot(local, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{manual}}
  ROOT o = f32[16384,1024]{{1,0}} dot(h, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{manual}}
}}
{_ENTRY_HEAD}  c = f32[16384,1024]{{1,0}} call(to_local, w_local), to_apply=body, frontend_attributes={{inlineable="false"}}
  ROOT back = f32[131072,1024]{{1,0}} custom-call(c), {_TO_GLOBAL}
}}
"""

INLINED = f"""HloModule manual, num_partitions=8
{_ENTRY_HEAD}  h = f32[16384,1024]{{1,0}} dot(to_local, w_local), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{manual}}
  o = f32[16384,1024]{{1,0}} dot(h, w_local), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{manual}}
  ROOT back = f32[131072,1024]{{1,0}} custom-call(o), {_TO_GLOBAL}
}}
"""


def _estimate(text: str, target: str):  # type: ignore[no-untyped-def]
    prepared = prepare(parse_hlo(text), target)
    return estimate_module(prepared.module, propagate(prepared), prepared.mesh, prepared.target)


def test_a_shard_maps_edges_are_views_and_its_body_is_sized_inline() -> None:
    for target in ("cpu", "v6e"):
        called, inline = _estimate(MANUAL, target), _estimate(INLINED, target)
        assert called.temp_bytes > 0
        assert (called.temp_bytes, called.total_bytes) == (inline.temp_bytes, inline.total_bytes), target
    prepared = prepare(parse_hlo(INLINED), "v6e")
    model = ValueModel(prepared.module, propagate(prepared), True)
    model.build()
    # The local views share their global operand's buffer: t's 64 MiB shard is to_local's buffer.
    entry = prepared.module.entry.name
    assert model.uf.find((entry, "to_local", 0)) == model.uf.find((entry, "t", 0))
    assert model.uf.find((entry, "back", 0)) == model.uf.find((entry, "o", 0))
