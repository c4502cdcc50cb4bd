"""The module IR: immutable instructions, computations and the module.

Equality is structural and semantic: two modules are equal when they have the
same computations, instructions, shapes, operands and attribute values. Source
positions and the verbatim spelling of attributes are carried along for
messages and printing but are not compared.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from planner.hlo.ir.attributes import COMPUTATION_ATTRIBUTES, ComputationRefs, Metadata
from planner.hlo.ir.shapes import ArrayShape, Shape
from planner.sharding.hlo_sharding import HloSharding


@dataclass(frozen=True, slots=True)
class Attribute:
    """`key=value`; `value` is typed for modelled keys, else `attributes.Raw`."""

    key: str
    value: Any
    text: str = field(compare=False)


@dataclass(frozen=True, slots=True)
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    attributes: tuple[Attribute, ...] = ()
    # `parameter(N)` carries N; `constant(...)` carries its literal verbatim.
    parameter_number: int | None = None
    literal: str | None = None
    line: int = field(default=0, compare=False)

    def attr(self, key: str, default: Any = None) -> Any:
        # Instructions carry a handful of attributes; a scan beats a dict.
        for a in self.attributes:
            if a.key == key:
                return a.value
        return default

    def has_attr(self, key: str) -> bool:
        return any(a.key == key for a in self.attributes)

    @property
    def sharding(self) -> HloSharding | None:
        return self.attr("sharding")

    @property
    def metadata(self) -> Metadata | None:
        return self.attr("metadata")

    @property
    def called_computations(self) -> tuple[str, ...]:
        names: list[str] = []
        for a in self.attributes:
            if a.key in COMPUTATION_ATTRIBUTES and isinstance(a.value, ComputationRefs):
                names.extend(a.value.names)
        return tuple(names)

    @property
    def literal_key(self) -> Hashable:
        """A constant's value as passes compare it: its literal, or, where the text leaves the data out
        (`constant({...})`: XLA's dumps elide large literals), a value equal to no other constant's.

        Two elided constants of one shape need not be the same value (a splash-attention kernel's two
        s8[1,4,4] mask tables differ, and XLA keeps both where each is carried).
        """
        return ("elided", self.name) if self.literal == "{...}" else self.literal

    @property
    def array_shape(self) -> ArrayShape:
        assert isinstance(self.shape, ArrayShape), f"{self.name} has a tuple shape"
        return self.shape


@dataclass(frozen=True, slots=True)
class Computation:
    name: str
    instructions: tuple[Instruction, ...]
    root_name: str
    is_entry: bool = False
    # `, execution_thread="..."` after the body, verbatim.
    extra: tuple[tuple[str, str], ...] = ()
    line: int = field(default=0, compare=False)
    _by_name: Mapping[str, Instruction] = field(init=False, compare=False, repr=False)
    # Built on first use: parsing a module need not pay for a users map nobody may ask for.
    _users: Mapping[str, tuple[str, ...]] | None = field(init=False, compare=False, repr=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({i.name: i for i in self.instructions}))

    def __getitem__(self, name: str) -> Instruction:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    @property
    def root(self) -> Instruction:
        return self._by_name[self.root_name]

    @property
    def parameters(self) -> tuple[Instruction, ...]:
        """Parameter instructions in parameter-number order."""
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return tuple(sorted(params, key=lambda i: i.parameter_number or 0))

    def users(self, name: str) -> tuple[str, ...]:
        """Names of instructions that read `name`, in program order, once each."""
        users = self._users
        if users is None:
            found: dict[str, list[str]] = {i.name: [] for i in self.instructions}
            for inst in self.instructions:
                for op in dict.fromkeys(inst.operands):
                    found[op].append(inst.name)
            users = MappingProxyType({k: tuple(v) for k, v in found.items()})
            object.__setattr__(self, "_users", users)
        return users[name]

    def operands(self, inst: Instruction) -> tuple[Instruction, ...]:
        return tuple(self._by_name[o] for o in inst.operands)


@dataclass(frozen=True, slots=True)
class HloModule:
    name: str
    computations: tuple[Computation, ...]
    entry_name: str
    # Header `key=value` attributes after the name, typed where modelled.
    attributes: tuple[Attribute, ...] = ()
    # Debug-info tables (FileNames, FunctionNames, FileLocations, StackFrames):
    # section -> ((id, value text), ...).
    debug_tables: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()
    _by_name: Mapping[str, Computation] = field(init=False, compare=False, repr=False)
    # Built on first use, like Computation's users.
    _instruction_home: Mapping[str, str | None] | None = field(init=False, compare=False, repr=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({c.name: c for c in self.computations}))

    def _homes(self) -> Mapping[str, str | None]:
        homes = self._instruction_home
        if homes is None:
            found: dict[str, str | None] = {}
            for comp in self.computations:
                for inst in comp.instructions:
                    # A name used in two computations (legal in hand-written HLO)
                    # has no single home; lookups must name the computation.
                    found[inst.name] = None if inst.name in found else comp.name
            homes = MappingProxyType(found)
            object.__setattr__(self, "_instruction_home", homes)
        return homes

    @property
    def entry(self) -> Computation:
        return self._by_name[self.entry_name]

    def computation(self, name: str) -> Computation:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no computation named {name!r} in module {self.name}") from None

    def has_computation(self, name: str) -> bool:
        return name in self._by_name

    def instruction(self, name: str) -> Instruction:
        """The instruction called `name` anywhere in the module."""
        return self.computation(self.home_of(name))[name]

    def home_of(self, name: str) -> str:
        """The computation that holds instruction `name`."""
        if name not in self._homes():
            raise KeyError(f"no instruction named {name!r} in module {self.name}")
        home = self._homes()[name]
        if home is None:
            owners = [c.name for c in self.computations if name in c]
            raise KeyError(f"instruction name {name!r} is used in several computations: {owners}")
        return home

    def attr(self, key: str, default: Any = None) -> Any:
        for a in self.attributes:
            if a.key == key:
                return a.value
        return default

    @property
    def num_instructions(self) -> int:
        return sum(len(c) for c in self.computations)
