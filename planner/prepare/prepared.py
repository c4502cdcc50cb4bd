"""The module as one compiler's partitioner will see it: the only input propagation, memory and planning take."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.hlo.ir.module import HloModule
from planner.hlo.structure.loops import WhileLoop
from planner.mesh import Mesh
from planner.prepare.propagation_options import PropagationOptions
from planner.targets import Backend


@dataclass(frozen=True)
class PassRecord:
    """One pass that changed the module, and what it did."""

    name: str
    mirrors: str
    summary: str


@dataclass(frozen=True)
class PreparedModule:
    """A module after the front passes every compiler runs and its target compiler's own.

    `source` is the module as given (what verify compiles and what is printed back patched);
    `front` is it read as GSPMD with its calls inlined, the module placements are written against;
    `module` is `front` after the target's pre-partitioning passes, what propagation sees. On
    XLA:CPU the two are the same module. `aliases` maps every name the passes retired to the name
    that now holds its value; `made` names the instructions of `module` the target's passes made, by
    the pass that made each (`front` has no such instruction, or one of that name holding another
    value); `loops` are `module`'s While loops, found once.
    """

    source: HloModule
    front: HloModule
    module: HloModule
    target: Backend
    mesh: Mesh | None
    options: PropagationOptions
    aliases: Mapping[str, str]
    loops: tuple[WhileLoop, ...]
    passes: tuple[PassRecord, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    disabled: frozenset[str] = frozenset()  # target passes not run (`prepare`'s `disabled`)
    # The libtpu release the step is prepared as (None: none named or installed, the newest modelled).
    libtpu: str | None = None
    # A Shardy module as Shardy propagates it: `module` before it was read as GSPMD's, with the same
    # instruction names (None: propagate `module` with GSPMD's rules); and `front` likewise.
    shardy: HloModule | None = None
    shardy_front: HloModule | None = None
    made: Mapping[str, str] = field(default_factory=dict)

    @property
    def compiler(self) -> str:
        return self.target.compiler

    @property
    def written_front(self) -> HloModule:
        """The inlined module in the partitioner's own terms: what a change set is written into, printed back
        and compiled. A Shardy module's GSPMD reading drops its result pins (`xla.sdy.FuncResultSharding`),
        so compiled under Shardy it is another step; its Shardy form is the step as given, inlined."""
        return self.shardy_front if self.shardy_front is not None else self.front

    def loop(self, name: str) -> WhileLoop:
        for loop in self.loops:
            if loop.name == name:
                return loop
        raise KeyError(f"no While loop named {name!r} in module {self.module.name}")

    def resolve(self, name: str) -> str:
        """The name that holds `name`'s value in `module` (itself when no pass retired it)."""
        return self.aliases.get(name, name)
