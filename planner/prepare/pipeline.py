"""One pre-partitioning pipeline per compiler, as lists of pass values, and `prepare`, which runs one.

XLA:CPU runs little before it propagates (flatten-call-graph, call-inliner, zero-sized-HLO
elimination, conditional canonicalisation): its pipeline here is the front passes alone. XLA:TPU
runs a whole simplification pipeline first, whose loop passes change which values a While carries
and so what propagation decides; its pipeline models the passes that change decisions (see
`TPU_PASSES` and the README's table of passes, modelled and not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from planner.hlo.ir.module import HloModule
from planner.hlo.structure.inline import resolve_chains
from planner.hlo.structure.loops import while_loops
from planner.hlo.text.compile_defaults import with_jax_compile_defaults
from planner.hlo.text.shardy_import import SHARDY, partitioner_of, resolve_mesh
from planner.mesh import Mesh
from planner.mesh_check import mesh_warnings
from planner.prepare.algebraic_simplifier import AlgebraicSimplifier
from planner.prepare.broadcast_rewriter import TpuBroadcastRewriter
from planner.prepare.complex_rewriter import ComplexRewriter
from planner.prepare.constant_folding import ConstantFolding
from planner.prepare.constant_sinking import WhileLoopConstantSinking
from planner.prepare.constant_splitter import HloConstantSplitter
from planner.prepare.cse import HloCse
from planner.prepare.dead_code import HloDce, TupleSimplifier
from planner.prepare.degenerate_dims import DegenerateDimensionRewriter
from planner.prepare.fixed_point import FixedPoint
from planner.prepare.front import CallInlining, FlattenCallGraph, ShardyImport
from planner.prepare.list_order import AddedRootsLast
from planner.prepare.loop_invariant_motion import WhileLoopInvariantCodeMotion
from planner.prepare.module_dce import HloModuleDce
from planner.prepare.prepared import PassRecord, PreparedModule
from planner.prepare.propagation_options import PropagationOptions
from planner.prepare.reduce_rewriter import TpuReduceRewriter
from planner.prepare.rewrite import ModulePass, made_names
from planner.prepare.shardy_round_trip import ShardyRoundTrip
from planner.prepare.sparse_gradient import SparseGradientRewrite
from planner.prepare.while_simplifier import WhileLoopSimplifier
from planner.prepare.x64_rewriter import X64Rewriter
from planner.targets import Backend
from planner.targets import backend as backend_of

FRONT_PASSES: tuple[ModulePass, ...] = (ShardyImport(), CallInlining(), FlattenCallGraph())
# XLA:TPU's own first call inliner keeps large callees of several call sites as calls (`CallInlining`).
TPU_FRONT_PASSES: tuple[ModulePass, ...] = (ShardyImport(), CallInlining(keeps_shared_callees=True), FlattenCallGraph())

# XLA:TPU's passes before its partitioner that change what propagation decides, in its order (its
# dump of an LM step, pass by pass): the embedding-free cross-entropy gradient rewritten, 64-bit
# loop elements (torch_xla's s64 counter) carried as two u32 halves and complex ones (DeepSeek's
# rotary tables) as their real and imaginary parts, common subexpressions merged (the two RoPE
# tables become one), the module DCE's first loop clean-up, its
# `simplification-1` loop passes to their fixed point (with the net effect of its two layout
# passes, `tpu-broadcast-rewriter` and `tpu-degenerate-dimension-rewriter`, after
# `tpu-reduce-rewriter` as in XLA's order), and the partitioner's own constant splitter.
# Passes of that pipeline not listed change no sharding decision on the steps measured (the
# README's table of passes says which and why).
TPU_SIMPLIFICATION = FixedPoint(
    "simplification-1",
    (
        HloCse(),
        AlgebraicSimplifier(),
        TpuReduceRewriter(),
        DegenerateDimensionRewriter(),
        TpuBroadcastRewriter(),
        HloDce(),
        TupleSimplifier(),
        WhileLoopConstantSinking(sink_broadcast_of_constants=True, sink_only_scalar_constants=False),
        WhileLoopSimplifier(),
        WhileLoopInvariantCodeMotion(),
        ConstantFolding(),
        TupleSimplifier(),
        HloDce(),
        HloCse(),
        HloDce(),
        TupleSimplifier(),
    ),
)
TPU_PASSES: tuple[ModulePass, ...] = (
    SparseGradientRewrite(),
    X64Rewriter(),
    ComplexRewriter(),
    HloDce(),
    HloCse(),
    TupleSimplifier(),
    HloModuleDce(),
    TPU_SIMPLIFICATION,
    # `Phase_1_pre-layout_assignment_passes`'s algsimp after `simplification-1`: the first that
    # rewrites a dot with no contracting dims as a multiply.
    AlgebraicSimplifier(dot_to_multiply=True),
    HloConstantSplitter(split_expressions=True),
    HloDce(),
)

# Passes of today's XLA:TPU pipeline that an older libtpu does not run, by the first release that runs
# them: a step compiled by an older one is prepared with them disabled (`absent_passes`).
TPU_PASSES_SINCE: dict[str, tuple[int, ...]] = {DegenerateDimensionRewriter.NAME: (0, 0, 52)}
# Likewise what today's libtpu does after partitioning that the memory model follows, by the first release
# that does it: disabled, the backend is the older release's (`release_backend`).
SPARSE_CORE_THREAD_LOCAL = "sparse-core-thread-local-buffers"
TPU_RULES_SINCE: dict[str, tuple[int, ...]] = {SPARSE_CORE_THREAD_LOCAL: (0, 0, 52)}


def absent_passes(libtpu: str | None) -> frozenset[str]:
    """The modelled XLA:TPU passes libtpu `libtpu` (`0.0.50.1`) does not run: `prepare`'s `disabled` for its
    steps. None: the newest libtpu, which runs them all."""
    if libtpu is None:
        return frozenset()
    release = tuple(int(p) for p in libtpu.split(".") if p.isdigit())
    since = {**TPU_PASSES_SINCE, **TPU_RULES_SINCE}
    return frozenset(name for name, first in since.items() if release < first)


def release_backend(backend: Backend, disabled: frozenset[str]) -> Backend:
    """`backend` as the libtpu that does not do the rules `disabled` names (`TPU_RULES_SINCE`) compiles for it."""
    if SPARSE_CORE_THREAD_LOCAL in disabled and backend.sparse_core_table_copies:
        return dataclasses.replace(backend, sparse_core_table_copies=0)
    return backend


def installed_libtpu() -> str | None:
    """The libtpu this environment compiles XLA:TPU steps with (None: none installed)."""
    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return None


# The compiler's passes after the front ones, by compiler. XLA:GPU's pipeline is not modelled: its
# steps are prepared as XLA:CPU's (the planner has no GPU references to check one against).
TARGET_PASSES: dict[str, tuple[ModulePass, ...]] = {
    "cpu": (),
    "tpu": TPU_PASSES,
    "gpu": (),
}


@dataclass(frozen=True)
class Preparation:
    """The prepare pipeline as a value (see `planner.passes`): its target, mesh and options are its fields."""

    target: str | Backend = "cpu"
    mesh: Mesh | None = None
    options: PropagationOptions | None = None
    libtpu: str | None = None  # the libtpu the user compiles with (None: the installed one)

    def apply(self, module: HloModule) -> PreparedModule:
        return prepare(module, self.target, self.mesh, self.options, libtpu=self.libtpu)


def prepare(
    module: HloModule,
    target: str | Backend = "cpu",
    mesh: Mesh | None = None,
    options: PropagationOptions | None = None,
    *,
    pass_input: bool = False,
    disabled: frozenset[str] | None = None,
    libtpu: str | None = None,
) -> PreparedModule:
    """`module` as `target`'s compiler will partition it, with its mesh resolved and checked.

    `target` is `cpu` (XLA:CPU) or a chip preset, whose compiler's pipeline runs; `mesh` the mesh
    the user named (a Shardy module's own mesh wins, and a different one is an error); `options`
    default to the module header's, as XLA's compile takes them. `pass_input` says the module is
    already what the propagation pass receives (a dump taken at the pass, or the module of one of
    XLA's own propagation tests, which run the pass alone): no pass runs on it but reading Shardy.
    `disabled` names target passes not to run, as XLA's `--xla_disable_hlo_passes` does: the
    experiment that tells which pass changes a decision; left out, the passes the installed libtpu does not
    run (`absent_passes`: a step is prepared as the compiler at hand would compile it, the newest without one).
    `libtpu` names the release the user compiles with (`0.0.52`), in place of the installed one: its passes and
    rules (`TPU_RULES_SINCE`), and the references the verdict's band is drawn from (`PreparedModule.libtpu`).
    """
    libtpu = libtpu or installed_libtpu()
    if disabled is None:
        disabled = absent_passes(libtpu)
    return dataclasses.replace(_prepare(module, target, mesh, options, pass_input, disabled), libtpu=libtpu)


def _prepare(
    module: HloModule,
    target: str | Backend,
    mesh: Mesh | None,
    options: PropagationOptions | None,
    pass_input: bool,
    disabled: frozenset[str],
) -> PreparedModule:
    backend = release_backend(backend_of(target), disabled)
    # JAX's lowered text leaves out the compile options jit passes beside it: restored before anything reads them.
    module, assumed = with_jax_compile_defaults(module, mesh)
    warnings = tuple(assumed) + tuple(mesh_warnings(module, mesh))
    mesh = resolve_mesh(module, mesh)
    _check_partitions(module, mesh)
    options = options if options is not None else PropagationOptions.from_module(module)
    if partitioner_of(module) == SHARDY and not pass_input:
        # Shardy propagates the module as the compiler's passes leave it, Shardy's attributes and all;
        # everything after propagation reads that module as GSPMD's (`prepare.front.ShardyImport`).
        shardy_front, aliases, records, _ = _run(module, _front_passes(backend)[1:])
        front = ShardyImport().run(shardy_front).module
        return _target_passes(
            module, front, backend, mesh, options, aliases, records, warnings, disabled, shardy_front=shardy_front
        )
    front, aliases, records, _ = _run(module, (ShardyImport(),) if pass_input else _front_passes(backend))
    if pass_input:
        return PreparedModule(module, front, front, backend, mesh, options, aliases, while_loops(front),
                              tuple(records), warnings)  # fmt: skip
    return _target_passes(module, front, backend, mesh, options, aliases, records, warnings, disabled)


def reprepare(
    prepared: PreparedModule, front: HloModule, mesh: Mesh | None = None, shardy_front: HloModule | None = None
) -> PreparedModule:
    """The target's passes run again on a changed `front` (placements written, a mesh or batch changed).

    A Shardy module is propagated by Shardy's rules again only when `shardy_front` carries the same change
    in Shardy's form (what `annotate` keeps); otherwise the GSPMD reading is prepared and propagated.
    """
    mesh = mesh if mesh is not None else prepared.mesh
    again = _target_passes(
        prepared.source, front, prepared.target, mesh, prepared.options, prepared.aliases,
        prepared.passes[: _front_records(prepared)], prepared.warnings, prepared.disabled,
        shardy_front=shardy_front,
    )  # fmt: skip
    return dataclasses.replace(again, libtpu=prepared.libtpu)


def annotate(prepared: PreparedModule, write: Callable[[HloModule], HloModule]) -> PreparedModule:
    """`prepared` with annotations written (by `write`) into both its front and the module its
    compiler partitions, without running the passes again.

    Sharding annotations commute with every pass the pipelines model: none moves, merges or removes
    an annotated value or its annotation (loop-invariant motion hoists an annotation only with the
    invariant value it annotates, CSE compares shardings, the algebraic simplifier leaves annotated
    values alone, dead-code removal keeps an annotation of a value something reads), so writing
    them after the passes is writing them before. `write` must find its anchors in both modules:
    the passes keep the names of the instructions and computations they do not remove, and an
    anchor they retired is found where `aliases` says its value went (`apply_placements`). An
    instruction a pass made (`made`) is no anchor: the module as written has nothing of it to annotate.
    """
    module = write(prepared.module)
    shardy = write(prepared.shardy) if prepared.shardy is not None else None
    shardy_front = write(prepared.shardy_front) if prepared.shardy_front is not None else None
    return dataclasses.replace(
        prepared,
        front=write(prepared.front),
        module=module,
        loops=while_loops(module),
        shardy=shardy,
        shardy_front=shardy_front,
    )


def _target_passes(
    source: HloModule,
    front: HloModule,
    backend: Backend,
    mesh: Mesh | None,
    options: PropagationOptions,
    aliases: Mapping[str, str],
    records: Sequence[PassRecord],
    warnings: tuple[str, ...],
    disabled: frozenset[str] = frozenset(),
    shardy_front: HloModule | None = None,
) -> PreparedModule:
    passes = _without(_pipeline_for(backend.compiler, shardy_front is not None), disabled)
    if backend.compiler == "tpu" and AddedRootsLast.NAME not in disabled:
        # XLA's list order of what its passes added (see list_order.py): needs the module as written.
        passes = (*passes, AddedRootsLast.of(source))
    shardy: HloModule | None = None
    if shardy_front is not None:
        if ShardyRoundTrip.NAME not in disabled:
            # The loops as `shardy-xla`'s round trip through StableHLO leaves them (after the list order,
            # which its capture order depends on): what both Shardy and the partitioner see.
            passes = (*passes, ShardyRoundTrip())
        shardy, target_aliases, target_records, made = _run(shardy_front, passes)
        read = ShardyImport().run(shardy)
        module = read.module
        target_aliases = {**target_aliases, **read.renamed}
    else:
        module, target_aliases, target_records, made = _run(front, passes)
    merged = dict(aliases)
    merged.update(target_aliases)
    # A pass may give a new instruction a name an earlier one retired: the live instruction owns it.
    live = {i.name for c in module.computations for i in c}
    merged = {k: v for k, v in resolve_chains(merged).items() if k not in live}
    made = {name: by for name, by in made.items() if name in live}
    return PreparedModule(
        source=source,
        front=front,
        module=module,
        target=backend,
        mesh=mesh,
        options=options,
        aliases=merged,
        loops=while_loops(module),
        passes=(*records, *target_records),
        warnings=warnings,
        disabled=disabled,
        shardy=shardy,
        shardy_front=shardy_front,
        made=made,
    )


def _pipeline_for(compiler: str, shardy: bool) -> tuple[ModulePass, ...]:
    """The compiler's passes for the partitioner: with Shardy, XLA:TPU runs no `hlo-constant-splitter`
    (Shardy's import splits constants per use itself, `constant_or_scalar_splitter.cc`)."""
    passes = TARGET_PASSES[compiler]
    if shardy:
        passes = tuple(p for p in passes if not isinstance(p, HloConstantSplitter))
    return passes


def _without(passes: Sequence[ModulePass], disabled: frozenset[str]) -> tuple[ModulePass, ...]:
    """The passes less those named in `disabled`, inside fixed points too."""
    if not disabled:
        return tuple(passes)
    kept: list[ModulePass] = []
    for p in passes:
        if pass_name(p) in disabled:
            continue
        if isinstance(p, FixedPoint):
            p = FixedPoint(p.name, _without(p.passes, disabled))
        kept.append(p)
    return tuple(kept)


def _run(
    module: HloModule, passes: Sequence[ModulePass]
) -> tuple[HloModule, dict[str, str], list[PassRecord], dict[str, str]]:
    """The module after `passes`, the names they retired, what each did, and the instructions they made
    (name -> the pass that made it, the innermost one of a fixed point)."""
    aliases: dict[str, str] = {}
    records: list[PassRecord] = []
    made: dict[str, str] = {}
    for p in passes:
        rewrite = p.run(module)
        if rewrite.summary is None:
            continue
        made.update(rewrite.made or dict.fromkeys(made_names(module, rewrite.module), pass_name(p)))
        module = rewrite.module
        aliases.update(rewrite.renamed)
        records.append(PassRecord(pass_name(p), p.MIRRORS, rewrite.summary))
    return module, resolve_chains(aliases), records, made


def pass_name(p: ModulePass) -> str:
    """The compiler's name for the pass (a fixed point of several goes by its pipeline's name)."""
    return p.name if isinstance(p, FixedPoint) else p.NAME


def _front_passes(backend: Backend) -> tuple[ModulePass, ...]:
    return TPU_FRONT_PASSES if backend.compiler == "tpu" else FRONT_PASSES


def _front_records(prepared: PreparedModule) -> int:
    names = {p.NAME for p in FRONT_PASSES}
    return sum(1 for r in prepared.passes if r.name in names)


def _check_partitions(module: HloModule, mesh: Mesh | None) -> None:
    partitions = module.attr("num_partitions")
    if mesh is not None and partitions is not None and partitions != mesh.num_devices:
        raise ValueError(
            f"mesh {mesh.to_text()} has {mesh.num_devices} devices but the module has num_partitions={partitions}"
        )
