"""What every sharding-rule registry entry reads: the op, its operand and result dims, the registry's options.

Shardy's C++ entries read an MLIR op's typed accessors; ours read an HLO instruction's attributes, so
the few readers more than one entry needs (a window's pass-through test, a flag XLA keeps as a bare
word, the ops around this one) live here beside the view they read from. Which Shardy release the rule
is asked of travels with the view: an entry whose rule changed between releases reads how from
`op.release.traits`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.hlo.ir.attributes import ComputationRefs, Raw, WindowDim
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.propagation.shardy.release import ShardyRelease
from planner.propagation.shardy.rule import OpShardingRule, RuleBuilder

Dims = tuple[int, ...]
# The release a view asks when none is named: the newest.
NEWEST = ShardyRelease.newest()


@dataclass(frozen=True, slots=True)
class OpView:
    """One op as a registry entry sees it: the instruction, the dims of its operands and results.

    `results` are the array leaves of the result (a variadic reduce or a multi-operand sort has
    several). `computation`, when given, holds the instruction: the two entries that look past the
    op itself (concatenate asks whether its operands are slices, X64Combine whether a
    rng-bit-generator reads it) find the ops around it there. `module`, when given, holds the
    computations the op calls (a scatter's update computation).
    """

    inst: Instruction
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    conservative: bool = False
    computation: Computation | None = None
    release: ShardyRelease = NEWEST
    module: HloModule | None = None

    def builder(self) -> RuleBuilder:
        return RuleBuilder([len(d) for d in self.operands], [len(d) for d in self.results])

    def attr_dims(self, key: str) -> Dims:
        return tuple(self.inst.attr(key, ()))

    def attr_int(self, key: str, default: int) -> int:
        return int(self.inst.attr(key, default))

    def word(self, key: str, default: str) -> str:
        """An attribute XLA writes as a bare word the HLO reader keeps verbatim (`transpose_a=ADJOINT`)."""
        value = self.inst.attr(key)
        if value is None:
            return default
        return value.text if isinstance(value, Raw) else str(value)

    def flag(self, key: str) -> bool:
        """A boolean XLA prints only when true (`left_side=true`)."""
        return self.word(key, "false") == "true"

    def producer(self, operand: int) -> Instruction | None:
        """The instruction that defines operand `operand`, when the computation is known."""
        name = self.inst.operands[operand]
        if self.computation is None or name not in self.computation:
            return None
        return self.computation[name]

    def called(self, key: str) -> Computation | None:
        """The computation the attribute `key` names (`to_apply=add`), when the module is known."""
        refs = self.inst.attr(key)
        if self.module is None or not isinstance(refs, ComputationRefs) or len(refs.names) != 1:
            return None
        (name,) = refs.names
        return self.module.computation(name) if self.module.has_computation(name) else None

    def user_opcodes(self) -> tuple[str, ...]:
        if self.computation is None or self.inst.name not in self.computation:
            return ()
        return tuple(self.computation[user].opcode for user in self.computation.users(self.inst.name))


RuleFn = Callable[[OpView], OpShardingRule | None]


def pointwise(op: OpView) -> OpShardingRule | None:
    """Every dim of every operand and result is its own factor, sized by the first result (`buildPointwise`).

    Rank-0 tensors take no factor. A tensor whose dims differ from the first result's gets none: Shardy
    would build a rule its verifier then refuses (a variadic all-reduce of differently shaped arrays);
    so does an op with no result.
    """
    if not op.results:
        return None
    shape = op.results[0]
    if any(dims and dims != shape for dims in (*op.operands, *op.results)):
        return None
    return op.builder().add_pointwise(shape).build()


def is_window_pass_through(window: tuple[WindowDim, ...], dim: int) -> bool:
    """A window dim of size 1, stride 1 and no padding maps each input element to one output element.

    Dilations do not matter with a window of one element; a window that names no dims is such a
    window in every dim (Shardy's `isWindowPassthroughDim`).
    """
    if dim >= len(window):
        return True
    w = window[dim]
    return w.size == 1 and w.stride == 1 and w.pad_low == 0 and w.pad_high == 0
