"""XLA:TPU's windowed einsums: which FSDP dots its partitioner makes a loop over shards, and what they hold.

The model's side on small FSDP dots (`planner.memory.windowed_einsum`), and the table it reads
(`planner.targets.WINDOWED_EINSUM_FLOPS_PER_BYTE`) checked against libtpu itself: for every chip and
group size in the table, a dot 3% under the threshold compiles without a windowed loop and one 3% over
compiles with one (`fidelity.windowed_einsum_probe`); groups of 4 and of 64 devices get none at any size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from planner import parse_hlo
from planner.memory.communication import communication_buffers
from planner.prepare import prepare
from planner.propagation import propagate
from planner.targets import WINDOWED_EINSUM_FLOPS_PER_BYTE, backend

FORWARD = """HloModule fsdp_forward, num_partitions=8

ENTRY main {
  x = bf16[{rows},1024]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  w = bf16[1024,4096]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  ROOT y = bf16[{rows},4096]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}
}
"""

SHARED = """HloModule fsdp_shared_gather, num_partitions=8

ENTRY main {
  x = bf16[16384,1024]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  w = bf16[1024,4096]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  y = bf16[16384,4096]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}
  dx = bf16[16384,1024]{1,0} dot(y, w), lhs_contracting_dims={1}, rhs_contracting_dims={1}, sharding={devices=[8,1]<=[8]}
  ROOT out = (bf16[16384,4096]{1,0}, bf16[16384,1024]{1,0}) tuple(y, dx)
}
"""

GRADIENT = """HloModule fsdp_weight_gradient, num_partitions=8

ENTRY main {
  x = bf16[{rows},1024]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  dy = bf16[{rows},4096]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  ROOT dw = bf16[1024,4096]{1,0} dot(x, dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}
}
"""


def _spans(text: str, chip: str) -> list[tuple[str, int]]:
    prepared = prepare(parse_hlo(text), chip)
    result = propagate(prepared)
    module = prepared.module
    spans = communication_buffers(module, result, [module.entry_name], backend(chip))
    return [(s.kind, s.size_bytes) for s in spans.get(module.entry_name, [])]


def test_an_fsdp_weight_is_looped_over_not_gathered_past_the_chips_threshold() -> None:
    shard = 1024 * 4096 * 2 // 8
    # 2,048 tokens per device: 2,048 FLOPs per byte of the gathered bf16 weight, over v6e's 1,215 for 8 devices.
    assert _spans(FORWARD.replace("{rows}", "16384"), "v6e") == [("windowed einsum", 4 * shard)]
    # 1,024 tokens per device: under it, so the weight is gathered whole.
    assert _spans(FORWARD.replace("{rows}", "8192"), "v6e") == [("gathered", 8 * shard)]
    # v5e's threshold for 8 devices is 535: the same dot is looped there.
    assert _spans(FORWARD.replace("{rows}", "8192"), "v5e") == [("windowed einsum", 4 * shard)]
    # XLA:CPU has no windowed einsums.
    assert _spans(FORWARD.replace("{rows}", "16384"), "cpu") == [("gathered", 8 * shard)]


def test_a_gather_two_dots_share_is_not_windowed() -> None:
    # The partitioner's check_users_sharding: the weight's gather serves the backward dot too.
    assert _spans(SHARED, "v6e") == [("gathered", 1024 * 4096 * 2)]


def test_an_fsdp_weight_gradient_is_reduce_scattered_in_a_loop() -> None:
    out_shard = 1024 * 4096 * 2 // 8
    assert _spans(GRADIENT.replace("{rows}", "16384"), "v6e") == [("windowed einsum", 6 * out_shard)]
    kinds = [kind for kind, _ in _spans(GRADIENT.replace("{rows}", "8192"), "v6e")]
    assert "windowed einsum" not in kinds and "result before reduction" in kinds


# The topologies each threshold was measured on.
PROBED_TOPOLOGY = {
    ("v6e", 8): "v6e:2x4", ("v6e", 16): "v6e:4x4", ("v6e", 32): "v6e:4x8",
    ("v5e", 8): "v5e:2x4", ("v5e", 16): "v5e:4x4", ("v5e", 32): "v5e:4x8",
    ("v5p", 8): "v5p:2x2x2", ("v5p", 16): "v5p:2x2x4", ("v5p", 32): "v5p:2x4x4",
    ("v4", 8): "v4:2x2x1", ("v4", 16): "v4:2x2x2", ("v4", 32): "v4:2x2x4",
}  # fmt: skip
EDGES = [
    (chip, group, threshold) for chip, table in WINDOWED_EINSUM_FLOPS_PER_BYTE.items() for group, threshold in table
]


def _probe(topology: str, fsdp: int, tokens: list[int], *extra: str) -> list[bool]:
    argv = [sys.executable, "-m", "fidelity.windowed_einsum_probe", topology, str(fsdp), *extra]
    for t in tokens:
        argv += ["--tokens", str(t)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=True)
    return [json.loads(line)["windowed"] for line in out.stdout.splitlines() if line.startswith("{")]


def test_every_chip_and_group_size_has_a_threshold_and_a_probed_topology() -> None:
    assert {(chip, group) for chip, group, _ in EDGES} == set(PROBED_TOPOLOGY)


@pytest.mark.xla
@pytest.mark.parametrize(("chip", "group", "threshold"), EDGES)
def test_libtpu_windows_an_fsdp_dot_from_the_threshold_on(chip: str, group: int, threshold: int) -> None:
    under, over = int(threshold * 0.97), int(threshold * 1.03) + 1
    assert _probe(PROBED_TOPOLOGY[(chip, group)], group, [under, over]) == [False, True]


@pytest.mark.xla
def test_libtpu_windows_a_reduce_scatter_and_an_f32_dot_at_the_same_flops_per_byte() -> None:
    assert _probe("v6e:2x4", 8, [1178, 1252], "--kind", "rs") == [False, True]
    # f32: twice the bytes per element, so twice the tokens for the same ratio.
    assert _probe("v6e:2x4", 8, [2357, 2504], "--dtype", "f32") == [False, True]


@pytest.mark.xla
def test_libtpu_never_windows_a_group_of_4_or_of_more_than_32() -> None:
    assert _probe("v6e:2x2", 4, [65536]) == [False]
    assert _probe("v6e:8x8", 64, [65536]) == [False]
