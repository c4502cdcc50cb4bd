"""HLO -> StableHLO that jaxlib's compilers turn back into the same HLO module before they partition it.

jaxlib (and libtpu, the only way to XLA:TPU without a TPU) compiles StableHLO only. `hlo_to_stablehlo`
imports a module faithfully, but the compile path canonicalizes the MLIR before exporting it back to
HLO (see `planner.hlo.structure.seal`), and GSPMD decides differently on what comes back: on the bundled
torch_xla step XLA:CPU allocates 368.4 MiB per device where torch_xla's own compile of the same
module allocates 633.4 MiB. The faithful conversion:

1. seals the HLO module (`planner.hlo.structure.seal`): every instruction of a control-flow computation in a
   computation of its own, every pass-through While element behind an identity call; XLA's
   call-inliner undoes both before propagation;
2. imports it (`hlo_to_stablehlo`);
3. keeps unit-dim broadcasts broadcasts (`KeepUnitDimBroadcasts`), the rewrite a call cannot hide,
   and the header's buffer donors, which the importer drops (`KeepBufferDonors`);
4. checks the round trip (`planner.plan.compilers.round_trip`): exported by the compile path's own converter
   and inlined, the module must be the original, instruction for instruction, less what mhlo
   rewrites of an op alone and GSPMD cannot tell apart (unannotated identities folded, unit-dim
   iotas split: `canonicalized_alone`), or the conversion raises `UnfaithfulConversion`.

Measured on the corpus's six torch_xla steps: jaxlib's XLA:CPU on the converted module allocates
torch_xla's own bytes to the byte, with its While shapes, and libtpu's XLA:TPU on it gives what
libtpu gives on the HLO proto itself (its PJRT C API takes format "hlo"; jaxlib's Python API does not).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from planner.errors import UnfaithfulConversion
from planner.hlo.ir.module import HloModule
from planner.hlo.structure.seal import seal
from planner.hlo.text import jaxlib_api
from planner.hlo.text.printer import print_module
from planner.memory.donation import buffer_donors
from planner.plan.compilers.round_trip import canonicalized_alone, check_round_trip


@dataclass(frozen=True)
class KeepUnitDimBroadcasts:
    """`broadcast_in_dim` that only prepends size-1 dims -> `stablehlo.broadcast`, which exports as the same HLO.

    mhlo's BroadcastInDimSimplifier rewrites a `broadcast_in_dim` with as many elements as its
    operand and sorted dims into a `reshape`, and the op alone is enough for it, so sealing does not
    help. It matters: XLA's sharding propagation moves a sharding forward through a broadcast only at
    aggressiveness 3 ("make forward propagation through broadcast low priority",
    sharding_propagation.cc), through a reshape from aggressiveness 0. torch_xla unsqueezes each
    layer's gradient with such a broadcast before writing it into the stacked gradient; as a reshape
    it hands the stack the gradient's sharding three rounds early.

    `stablehlo.broadcast` (sizes prepended) has no such pattern, and the exporter writes it as
    `broadcast(x), dimensions={k..rank-1}`. Example: f32[1024,1024] -> f32[1,1024,1024] with dims
    [1, 2] becomes `stablehlo.broadcast %x, sizes = [1]`, exported as `f32[1,1024,1024]
    broadcast(%x), dimensions={1,2}`. A broadcast the simplifier would rewrite with size-1 dims
    anywhere but in front, or with dims out of order (a transpose), has no spelling that survives: it
    is refused. Identities are left to `canonicalized_alone`.
    """

    name: str = "keep-unit-dim-broadcasts"

    def apply(self, module: Any) -> int:
        """Rewrites `module` (a jaxlib `ir.Module`) in place; returns how many broadcasts it rewrote."""
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import stablehlo

        found = [op for op in _operations(module.operation) if op.name == "stablehlo.broadcast_in_dim"]
        rewritten = 0
        for op in found:
            operand = op.operands[0]
            source, result = ir.RankedTensorType(operand.type), ir.RankedTensorType(op.results[0].type)
            if not (source.has_static_shape and result.has_static_shape):
                continue
            if _num_elements(source.shape) != _num_elements(result.shape):
                continue  # a real broadcast: the simplifier leaves it alone
            dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            if list(source.shape) == list(result.shape) and dims == list(range(result.rank)):
                continue  # an identity: it folds whatever is done here
            num_new = result.rank - source.rank
            if dims != list(range(num_new, result.rank)):
                raise UnfaithfulConversion(
                    f"a broadcast {source} -> {result} with dims {dims}: the canonicalizer turns it into a reshape "
                    "or transpose, and StableHLO has no op that survives it and exports as this broadcast"
                )
            with ir.InsertionPoint(op), op.location:
                kept = stablehlo.BroadcastOp(operand, ir.DenseI64ArrayAttr.get(list(result.shape[:num_new])))
            for attr in op.attributes:  # mhlo.sharding and friends stay on the op
                if attr.name != "broadcast_dimensions":
                    kept.operation.attributes[attr.name] = attr.attr
            op.results[0].replace_all_uses_with(kept.result)
            op.erase()
            rewritten += 1
        return rewritten


@dataclass(frozen=True)
class KeepBufferDonors:
    """The header's `buffer_donor` set as `jax.buffer_donor = true` on the entry function's arguments.

    `hlo_to_stablehlo` drops the set; the exporter on the compile path turns `jax.buffer_donor`
    argument attributes back into it. Without it XLA cannot reuse a donated parameter's buffer for
    an output: on torch_xla's LM AdamW steps (moments and weights donated) XLA:TPU's total grows by
    a quarter. Example: `buffer_donor={ (1, {}) }` -> `@main(%arg0, %arg1 {jax.buffer_donor = true},
    ...)` -> exported `buffer_donor={ (1, {}) }`. A donor inside a tuple parameter (the importer
    flattens tuples) is refused.
    """

    donors: frozenset[tuple[int, tuple[int, ...]]]
    name: str = "keep-buffer-donors"

    def apply(self, module: Any) -> int:
        """Marks the donated arguments of `module`'s public `main`; returns how many."""
        from jaxlib.mlir import ir

        if not self.donors:
            return 0
        if any(index for _, index in self.donors):
            raise UnfaithfulConversion(f"buffer donors inside tuple parameters {sorted(self.donors)} are not kept")
        (main,) = [op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main"]
        num_args = len(main.regions[0].blocks[0].arguments)
        old = list(ir.ArrayAttr(main.attributes["arg_attrs"])) if "arg_attrs" in main.attributes else []
        attrs = [_entries(ir.DictAttr(d)) for d in old] or [{} for _ in range(num_args)]
        for number, _ in self.donors:
            attrs[number]["jax.buffer_donor"] = ir.BoolAttr.get(True)
        main.attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(d) for d in attrs])
        return len(self.donors)


def _entries(attr: Any) -> dict[str, Any]:
    """An MLIR dictionary attribute as a Python dict of its named attributes."""
    return {attr[i].name: attr[i].attr for i in range(len(attr))}


def _operations(parent: Any) -> Iterator[Any]:
    """Every operation nested in `parent`, in order (functions, then the regions of while, reduce, ...)."""
    for region in parent.regions:
        for block in region.blocks:
            for op in block.operations:
                yield op.operation
                yield from _operations(op.operation)


def _num_elements(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


@dataclass(frozen=True)
class FaithfulStableHlo:
    """StableHLO bytecode for `Client.compile`, and what the conversion did to get it."""

    mlir: bytes
    num_sealed: int
    num_pass_through: int
    num_kept_broadcasts: int
    # Identity instructions (unannotated) MLIR folds into their operands, and unit-dim iotas it writes
    # as a 1-D iota and a reshape: the changes XLA sees (`planner.plan.compilers.round_trip.canonicalized_alone`).
    folded_identities: tuple[str, ...]
    split_iotas: tuple[str, ...]

    def summary(self) -> dict[str, int]:
        return {
            "sealed_instructions": self.num_sealed,
            "pass_through_elements": self.num_pass_through,
            "kept_broadcasts": self.num_kept_broadcasts,
            "folded_identities": len(self.folded_identities),
            "split_iotas": len(self.split_iotas),
        }


def faithful_stablehlo(module: HloModule, check: bool = True) -> FaithfulStableHlo:
    """StableHLO that jaxlib's compile path turns back into `module`; raises UnfaithfulConversion if none.

    `check=False` skips the round-trip check (about a third of the time): for experiments only.
    """
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    canonical = canonicalized_alone(module)  # refuses sharded identities and iotas before any work
    sealed = seal(module)
    imported = jaxlib_api.hlo_to_stablehlo(print_module(sealed.module))
    with jax_mlir.make_ir_context(), ir.Location.unknown():
        mlir_module = ir.Module.parse(imported)
        num_kept = KeepUnitDimBroadcasts().apply(mlir_module)
        KeepBufferDonors(buffer_donors(module)).apply(mlir_module)
        out = io.BytesIO()
        mlir_module.operation.write_bytecode(out)
    converted = FaithfulStableHlo(out.getvalue(), sealed.num_sealed, sealed.num_pass_through, num_kept,
                                  canonical.folded_identities, canonical.split_iotas)  # fmt: skip
    if check:
        check_round_trip(module, converted.mlir)
    return converted


def plain_stablehlo(text: str) -> bytes:
    """`hlo_to_stablehlo` alone: what the compile path then canonicalizes (see the module's docstring)."""
    return jaxlib_api.hlo_to_stablehlo(text)
