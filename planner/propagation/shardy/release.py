"""Which Shardy writes the rules: the releases the registry knows, and every rule that differs between them.

JAX carries Shardy inside jaxlib, so the Shardy a module meets is the jaxlib's that compiles it: jaxlib
0.7.1 holds openxla/shardy@5b3b2894 (2025-08-15); jaxlib 0.12.0.1 holds a Shardy at least as new as
openxla/shardy@a0277a83 (2026-08-22), whose binary already writes two rules (reshape, dynamic-update-slice)
as a0277a83's sources do not yet; jaxlib 0.12.1's gives five custom calls no rule (`make test-release`
found it). A rule that changed between them is one field of `RegistryTraits`,
set once per release in `_TRAITS` below; the registry's entries read the field (`op.release.traits`), so
a new release is one more row, not a branch in every entry.

Which release a rule is asked of: the one the caller names (the release of the jaxlib that wrote or will
compile the module), else the installed jaxlib's, else, with no jaxlib installed, the newest.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

from planner.propagation.shardy.rule import FactorType


@dataclass(frozen=True, slots=True)
class RegistryTraits:
    """The rules one Shardy release writes its own way, one field per change (`op_sharding_rule_registry.cc`)."""

    # The three reshape fields and the dynamic-update-slice one follow jaxlib 0.12.0.1's own rules, which
    # a0277a83's sources do not write yet (`ReshapeOp`, `DynamicUpdateSliceOp` cases).
    # reshape: the factor of a size-1 dim.
    reshape_size_one: FactorType
    # reshape: pieces of the two sides that share no divisor (a swap, `f32[3,2] -> f32[2,3]`). None: each
    # side takes its piece as a factor of its own; else one factor of the operand's piece on both dims.
    reshape_swapped: FactorType | None
    # reshape: the factors one side takes alone while the two sides are out of step.
    reshape_one_sided: FactorType
    # dynamic-update-slice, a dim the update covers in part: (operand and result's factor, update's).
    dynamic_update_slice_window: tuple[FactorType, FactorType]
    # scatter, a window dim the updates cover in part: the input's factor (shardy@cf75920b).
    scatter_partial_window_input: FactorType
    # scatter, an implicit batch dim: a reduction only when the update computation is one Shardy knows
    # how to reduce across devices, else need-replication (shardy@b708534e).
    scatter_checks_reducer: bool
    # concatenate of one array with itself: a permutation only if some operand is a slice of it
    # (shardy@77965a29); before, any concatenate of one array was.
    concatenate_same_array_needs_slice: bool
    # gather, a collapsed dim of size 1: reduction, or need-replication (shardy@99315094).
    gather_size_one_collapsed: FactorType
    # custom call @X64Combine read by a rng-bit-generator: its (blocked) factor (shardy@e3d919ea).
    x64_combine_seeding_rng: FactorType
    # HLO opcodes and custom-call targets the registry has no entry for in this release.
    unknown_opcodes: frozenset[str]
    unknown_targets: frozenset[str]


@dataclass(frozen=True, slots=True)
class PipelineTraits:
    """What one release's `sdy-propagation-pipeline` does its own way around propagation, one field per change."""

    # `sdy-propagate-to-func-results` writes the main function's unsharded results too (the returned
    # value's sharding): jaxlib 0.12.0.1 and 0.12.1 do, as their own pass shows on a bare module; a0277a83's
    # sources skip main, and jaxlib 0.7.1's pipeline has no such pass.
    main_results_from_terminator: bool


class ShardyRelease(enum.Enum):
    """A Shardy whose rules the registry knows, keyed by the version of the first jaxlib that carries it."""

    JAXLIB_0_7 = (0, 7)
    JAXLIB_0_12 = (0, 12)
    JAXLIB_0_12_1 = (0, 12, 1)

    @property
    def jaxlib(self) -> tuple[int, ...]:
        return tuple(self.value)

    @property
    def traits(self) -> RegistryTraits:
        """How this release writes the rules that changed."""
        return _TRAITS[self]

    @property
    def pipeline(self) -> PipelineTraits:
        """What this release's pipeline does its own way around propagation."""
        return _PIPELINE[self]

    @property
    def shardy(self) -> str:
        """The Shardy source this release's registry is, for messages."""
        return _SHARDY[self]

    @property
    def label(self) -> str:
        """For people: `jaxlib 0.12's Shardy (openxla/shardy@a0277a83 or later)`."""
        return f"jaxlib {'.'.join(map(str, self.jaxlib))}'s Shardy ({self.shardy})"

    @classmethod
    def newest(cls) -> ShardyRelease:
        return max(cls, key=lambda release: release.jaxlib)

    @classmethod
    def for_jaxlib(cls, version: Sequence[int]) -> ShardyRelease:
        """The release a jaxlib of `version` carries: the newest not newer than it.

        A jaxlib between two known ones (0.8 to 0.11) gets the older release's rules, the ones it was
        built on; a jaxlib older than every known one gets the oldest.
        """
        known = sorted(cls, key=lambda release: release.jaxlib)
        fitting = [release for release in known if release.jaxlib <= tuple(version)]
        return fitting[-1] if fitting else known[0]

    @classmethod
    def installed(cls) -> ShardyRelease:
        """The installed jaxlib's release; the newest when no jaxlib is installed."""
        return _installed()


def clear_caches() -> None:
    _installed.cache_clear()


@cache
def _installed() -> ShardyRelease:
    from planner.hlo.text.jaxlib_api import jaxlib_version

    try:
        version = jaxlib_version()
    except ImportError:
        return ShardyRelease.newest()
    return ShardyRelease.for_jaxlib(version)


_SPMD_PERMUTING_TARGETS = frozenset(
    "_SPMDInternalOp_MultiPad _SPMDInternalOp_MultiRotate _SPMDInternalOp_MultiSlice _SPMDInternalOp_RotateRight "
    "_SPMDInternalOp_Wrap".split()
)

_SHARDY = {
    ShardyRelease.JAXLIB_0_7: "openxla/shardy@5b3b2894",
    ShardyRelease.JAXLIB_0_12: "openxla/shardy@a0277a83 or later",
    ShardyRelease.JAXLIB_0_12_1: "the openxla/shardy jaxlib 0.12.1 carries (after a0277a83)",
}

# Custom calls jaxlib 0.12.1's Shardy gives no rule (`sdy-populate-op-sharding-rules` leaves them without
# one, where jaxlib 0.12.0.1 writes a pointwise or QR rule): the registry's custom-call entries for XLA's
# x64 emulation and blocked QR are gone from it.
_DROPPED_IN_0_12_1 = frozenset({"CompactWyHelper", "QrDecompositionBlock", "X64Combine", "X64SplitHigh", "X64SplitLow"})

_TRAITS = {
    ShardyRelease.JAXLIB_0_7: RegistryTraits(
        reshape_size_one=FactorType.PASS_THROUGH,
        reshape_swapped=None,
        reshape_one_sided=FactorType.PASS_THROUGH,
        dynamic_update_slice_window=(FactorType.PASS_THROUGH, FactorType.NEED_REPLICATION),
        scatter_partial_window_input=FactorType.PASS_THROUGH,
        scatter_checks_reducer=False,
        concatenate_same_array_needs_slice=False,
        gather_size_one_collapsed=FactorType.REDUCTION,
        x64_combine_seeding_rng=FactorType.PASS_THROUGH,
        # The batch-norm entry (shardy@321f901b), the SPMD partitioner's permuting calls (shardy@826f349c,
        # @2df5967b) and XLA's debug log (shardy@2685d64e, no rule either way) came later.
        unknown_opcodes=frozenset({"batch-norm-inference"}),
        unknown_targets=_SPMD_PERMUTING_TARGETS | {"xla.debug.Log"},
    ),
    ShardyRelease.JAXLIB_0_12: RegistryTraits(
        reshape_size_one=FactorType.NEED_REPLICATION,
        reshape_swapped=FactorType.PERMUTATION,
        reshape_one_sided=FactorType.NEED_REPLICATION,
        dynamic_update_slice_window=(FactorType.PERMUTATION, FactorType.PERMUTATION),
        scatter_partial_window_input=FactorType.NEED_REPLICATION,
        scatter_checks_reducer=True,
        concatenate_same_array_needs_slice=True,
        gather_size_one_collapsed=FactorType.NEED_REPLICATION,
        x64_combine_seeding_rng=FactorType.NEED_REPLICATION,
        unknown_opcodes=frozenset(),
        unknown_targets=frozenset(),
    ),
}
_TRAITS[ShardyRelease.JAXLIB_0_12_1] = replace(_TRAITS[ShardyRelease.JAXLIB_0_12], unknown_targets=_DROPPED_IN_0_12_1)

_PIPELINE = {
    ShardyRelease.JAXLIB_0_7: PipelineTraits(main_results_from_terminator=False),
    ShardyRelease.JAXLIB_0_12: PipelineTraits(main_results_from_terminator=True),
    ShardyRelease.JAXLIB_0_12_1: PipelineTraits(main_results_from_terminator=True),
}
