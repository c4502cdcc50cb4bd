"""Which calls XLA:TPU's first call inliner leaves as calls.

libtpu runs its own `call-inliner` before the X64 rewriter and its partitioner, and it does not inline
every call as XLA:CPU's does: a callee with two call sites or more that holds 20 instructions or more
(its parameters and root counted, its own calls inlined first, as the inliner visits callees before
callers) stays a call until `tpu-call-inliner` runs after partitioning. Until then every pass sees it
as a computation of its own: CSE merges nothing across the call, and the partitioned module holds the
callee once. MaxText's grouped matmuls (`gmm`, called twice by each MoE layer) are such callees; their
searchsorted loops are not merged with the ones inlined beside them.

The rule is measured, not read: libtpu's source is closed. Pass-by-pass dumps of steps compiled ahead of
time for v6e by libtpu 0.0.50.1 and 0.0.52 (`fidelity/tpu_call_inliner_probe.py`) keep a callee of two
sites at 20 instructions (19 elementwise ops and a parameter; 11 parameters and 10 adds; 10 ops inlined
into 11 ops with one parameter each) and inline it at 19; a callee of one call site is inlined at any
size. A DeepSeek-V2 step agrees: every callee it keeps has 21 instructions or more, every one it
inlines 19 or fewer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.structure.inline import inlineable

# The fewest instructions of a callee with several call sites that XLA:TPU's first inliner keeps.
KEPT_SHARED_CALLEE_SIZE = 20


def tpu_inlineable(module: HloModule, kept_size: int = KEPT_SHARED_CALLEE_SIZE) -> Callable[[Instruction], bool]:
    """The calls of `module` XLA:TPU's first call inliner inlines (a predicate for `inline_calls`)."""
    sites = Counter(callee for comp in module.computations for inst in comp if inlineable(inst)
                    for callee in inst.called_computations)  # fmt: skip
    sizes: dict[str, int] = {}
    kept: set[str] = set()

    def size(comp: Computation) -> int:
        """Instructions of `comp` once the calls the inliner inlines into it are inlined."""
        if comp.name not in sizes:
            total = len(comp.instructions)
            for inst in comp:
                if not inlineable(inst):
                    continue
                callee = module.computation(inst.called_computations[0])
                callee_size = size(callee)
                if sites[callee.name] > 1 and callee_size >= kept_size:
                    kept.add(callee.name)
                    continue
                # The call gives way to the callee's instructions but its parameters.
                total += callee_size - len(callee.parameters) - 1
            sizes[comp.name] = total
        return sizes[comp.name]

    for comp in module.computations:
        size(comp)
    return lambda inst: inlineable(inst) and inst.called_computations[0] not in kept
