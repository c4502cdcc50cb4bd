"""Values and the buffers they share: XLA's dataflow aliasing, per device.

Every array leaf an instruction defines is a value `(computation, instruction, leaf)`. Views share
their source's buffer (get-tuple-element, tuple, opt-barrier, Sharding annotations, bitcasts and same-size reshapes, an
in-place dynamic-update-slice); a While ties its carried elements to its body's parameter and root
and, where XLA's copy insertion does not copy, to its init. A union-find holds who shares with whom;
`ValueModel` also records which values need memory of their own and their per-device sizes.
"""

from __future__ import annotations

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.opcodes import ELEMENTWISE
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.hlo.ir.tuple_leaves import leaf_offsets
from planner.hlo.structure.loops import invariant_elements
from planner.memory.buffers import (
    FUSIBLE,
    Value,
    array_leaves,
    is_sharding_annotation,
    leaf_shardings,
    materialises,
    per_device_bytes,
    sharding_of,
)
from planner.memory.donation import ShapeIndex, output_parameter_pairs
from planner.memory.host_offload import TO_DEVICE, TO_HOST, movement, offload_starts
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding

# Custom calls at a manual region's edges (Shardy's and GSPMD's shard_map): views, leaf for operand.
MANUAL_REGION_EDGES = frozenset(
    {"xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape", "SPMDFullToShardShape", "SPMDShardToFullShape"}
)


class UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Value, Value] = {}

    def find(self, v: Value) -> Value:
        self.parent.setdefault(v, v)
        root = v
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[v] != root:
            self.parent[v], v = root, self.parent[v]
        return root

    def union(self, a: Value, b: Value) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


class ValueModel:
    def __init__(
        self,
        module: HloModule,
        result: PropagationResult,
        accelerator: bool = False,
        all_reduces_in_place: bool = False,
    ) -> None:
        self.module = module
        self.result = result
        self.accelerator = accelerator  # fused the way XLA:TPU and XLA:GPU fuse (`materialises`)
        # The backend's all-reduce writes over its operand (`Backend.all_reduces_in_place`).
        self.all_reduces_in_place = all_reduces_in_place
        self.uf = UnionFind()
        self.allocating: set[Value] = set()  # values that need memory of their own
        self.size: dict[Value, int] = {}
        self.info: dict[Value, tuple[ArrayShape, HloSharding | None]] = {}
        self.loop_of: dict[Value, str] = {}
        self.body_of: dict[str, Instruction] = {}  # body/cond computation -> While
        # Each computation's values, in the order they were defined (the order of `size`).
        self.values_in: dict[str, list[Value]] = {}
        # Instructions fusion computes inside their consumers: they hold no buffer, and what they read
        # is read where those consumers run (`read_ends`). Kept for the accelerators' fusion, whose
        # duplication of cheap ops into every consumer makes such chains long; XLA:CPU's model reads at
        # the fused instruction itself (measured: reading at the consumers moved the CPU grid's GPT-2
        # Shardy step from -1.5% to +13.7% of XLA:CPU's bytes).
        self.fused: set[tuple[str, str]] = set()
        # Where host offload starts (`planner.memory.host_offload`): every buffer sharing one of these is
        # in host memory.
        self.host_starts: list[Value] = []
        # Output leaves written into a parameter's buffer (aliased or paired with a donor): not buffers of
        # their own, and subtracted from the total as XLA's alias bytes.
        self.outputs_in_parameters: set[int] = set()
        # Each of those output leaves: the (parameter number, parameter shape index) it is written into.
        self.output_parameters: dict[int, tuple[int, ShapeIndex]] = {}

    def value(self, comp: str, name: str, leaf: int) -> Value:
        return (comp, name, leaf)

    def build(self) -> None:
        for comp in self.module.computations:
            for inst in comp.instructions:
                if inst.opcode == "while":
                    self.body_of[inst.attr("body").names[0]] = inst
                    self.body_of[inst.attr("condition").names[0]] = inst
        for name in self.walk_order():
            comp = self.module.computation(name)
            for inst in comp.instructions:
                self._define(comp, inst)
                if self.accelerator and movement(inst) == TO_HOST:
                    self.host_starts += [self.value(comp.name, start, 0) for start, _ in offload_starts(comp, inst)]
        self.output_parameters = output_parameter_pairs(self.module, self.result)
        self.outputs_in_parameters = set(self.output_parameters)
        self._outputs_reuse_dying_operands()
        if self.all_reduces_in_place:
            self._all_reduces_write_in_place()

    def _outputs_reuse_dying_operands(self) -> None:
        """An elementwise output writes into the buffer of an operand that dies there.

        XLA's buffer assignment lets an elementwise instruction share its operand's buffer when the
        shapes match and nothing reads the operand afterwards (`CanShareOperandBufferWithUser`). For
        the entry's outputs this is what moves a temporary into the output allocation: gradients
        accumulated over microbatches in a loop and divided by their count once it ends are returned
        in the accumulators' own buffers, so they are held once, as outputs, not twice.
        """
        entry = self.module.entry
        root = entry.root
        if root.opcode != "tuple":
            return
        parameters = {self.uf.find(v) for v in self._entry_parameter_values()}
        # An output donated a parameter's buffer is written there instead.
        donated = self.outputs_in_parameters
        members: dict[Value, set[Value]] = {}
        for v in self.size:
            if v[0] == entry.name:
                members.setdefault(self.uf.find(v), set()).add(v)
        for index, name in enumerate(root.operands):
            if root.operands.count(name) != 1 or index in donated:
                continue
            # A placement pins an output with a Sharding annotation: a view of what it annotates.
            while is_sharding_annotation(entry[name]) and self._same_buffer(entry, entry[name].operands[0], name):
                name = entry[name].operands[0]
            inst = entry[name]
            if inst.opcode not in ELEMENTWISE:
                continue
            out = self.value(entry.name, name, 0)
            if out not in self.allocating:
                continue
            for operand in dict.fromkeys(inst.operands):
                source = self.value(entry.name, operand, 0)
                group = self.uf.find(source)
                if self.size.get(source) != self.size[out] or group in parameters:
                    continue
                if _only_reader(entry, members.get(group, set())) == name:
                    self.uf.union(source, out)
                    break

    def _all_reduces_write_in_place(self) -> None:
        """XLA:TPU's all-reduce writes its result over its operand when the all-reduce is the operand's only reader.

        XLA:TPU runs an all-reduce as `all-reduce-start`/`all-reduce-done`, and the start is one of XLA's in-place
        ops (`HloDataflowAnalysis::GetInPlaceInputOutputPairs`: operand k and result k share a buffer). Copy
        insertion adds a copy wherever sharing would clobber a value still needed: an operand another instruction
        reads, an entry parameter, a value that leaves its computation (a live-out, a loop-carried element), and a
        result returned in a donated parameter's buffer. A shard_map's explicit `psum` of a weight gradient
        (Mixtral's and DeepSeek-V2's expert gradients, 896 and 352 MiB per device) so holds one buffer, not two.
        """
        parameters = {self.uf.find(v) for v in self._entry_parameter_values()}
        for comp in self.module.computations:
            reduces = [inst for inst in comp.instructions if inst.opcode == "all-reduce"]
            if not reduces:
                continue
            root = comp.root
            root_leaves = [self.value(comp.name, root.name, i) for i in range(len(array_leaves(root.shape)))]
            donated = self.outputs_in_parameters if comp.name == self.module.entry_name else set()
            for inst in reduces:
                results = [self.value(comp.name, inst.name, i) for i in range(len(array_leaves(inst.shape)))]
                for k, operand in enumerate(inst.operands):
                    if inst.operands.count(operand) != 1 or not isinstance(comp[operand].shape, ArrayShape):
                        continue
                    out, source = results[k], self.value(comp.name, operand, 0)
                    group = self.uf.find(source)
                    if out not in self.size or self.size.get(source) != self.size[out] or group in parameters:
                        continue
                    if any(self.uf.find(r) == group for r in results):
                        continue  # another operand of this all-reduce is a view of the same buffer
                    if any(self.uf.find(leaf) == group for leaf in root_leaves):
                        continue  # the operand leaves the computation
                    if any(self.uf.find(root_leaves[i]) == self.uf.find(out) for i in donated if i < len(root_leaves)):
                        continue  # the result is written into a donated parameter's buffer
                    members = {v for v in self.values_in.get(comp.name, ()) if self.uf.find(v) == group}
                    if _only_reader(comp, members) == inst.name:
                        self.uf.union(source, out)

    def _same_buffer(self, comp: Computation, a: str, b: str) -> bool:
        return self.uf.find(self.value(comp.name, a, 0)) == self.uf.find(self.value(comp.name, b, 0))

    def walk_order(self) -> list[str]:
        """Entry and every While body/condition reachable from it."""
        order, stack = [], [self.module.entry_name]
        while stack:
            name = stack.pop()
            if name in order:
                continue
            order.append(name)
            for inst in self.module.computation(name).instructions:
                if inst.opcode == "while":
                    stack += [inst.attr("body").names[0], inst.attr("condition").names[0]]
        return order

    def _define(self, comp: Computation, inst: Instruction) -> None:
        leaves = array_leaves(inst.shape)
        shardings = leaf_shardings(inst.shape, sharding_of(self.result, inst.name))
        for i, (leaf, s) in enumerate(zip(leaves, shardings)):
            v = self.value(comp.name, inst.name, i)
            self.uf.find(v)
            if v not in self.size:
                self.values_in.setdefault(comp.name, []).append(v)
            self.size[v] = per_device_bytes(leaf, s)
            self.info[v] = (leaf, s)
        op = inst.opcode
        operands = [comp[o] for o in inst.operands]
        if op == "get-tuple-element" and inst.name != comp.root_name and not comp.users(inst.name):
            # Read by nothing: XLA's HloDCE removes it before buffer assignment, in every compiler's pipeline,
            # so it holds no memory even where its sharding differs from the tuple's. Example: the
            # get-tuple-elements of a loop condition that reads only the counter, which JAX's lowered text
            # keeps and XLA's dump never writes.
            return
        if op == "get-tuple-element":
            source = operands[0].shape
            assert isinstance(source, TupleShape)
            base = leaf_offsets(source)[inst.attr("index")]
            for i in range(len(leaves)):
                self._view(self.value(comp.name, operands[0].name, base + i), self.value(comp.name, inst.name, i))
        elif is_sharding_annotation(inst):
            # XLA's sharding remover points the annotation's users at its operand.
            for i in range(len(leaves)):
                self._view(self.value(comp.name, operands[0].name, i), self.value(comp.name, inst.name, i))
            if (comp.name, operands[0].name) in self.fused:
                # An annotation on a value computed in its consumers is gone before fusion: its
                # readers read the value.
                self.fused.add((comp.name, inst.name))
        elif op == "custom-call" and inst.attr("custom_call_target") in MANUAL_REGION_EDGES:
            # A shard_map's edges: after partitioning each device's local value is its shard of the
            # global one, the same buffer. An operand held at another size is resharded first (a
            # buffer of its own).
            for i, edge_operand in enumerate(operands[: len(leaves)]):
                global_value = self.value(comp.name, edge_operand.name, 0)
                local_value = self.value(comp.name, inst.name, i)
                if self.size.get(global_value) == self.size[local_value]:
                    self._view(global_value, local_value)
                else:
                    self.allocating.add(local_value)
        elif (
            self.accelerator
            and (moving := movement(inst)) is not None
            and (moving == TO_DEVICE or offload_starts(comp, inst)[0][1])
        ):
            # Host offload (an accelerator's: XLA:CPU has no host memory space of its own): the slice a
            # MoveToHost writes into a host buffer is written from where it is, and a MoveToDevice's value is
            # the slice read back (`planner.memory.host_offload`).
            self._view(self.value(comp.name, operands[0].name, 0), self.value(comp.name, inst.name, 0))
        elif op == "opt-barrier":
            # XLA's dataflow forwards the operand's buffers through the barrier, leaf by leaf.
            for i in range(len(leaves)):
                self._view(self.value(comp.name, operands[0].name, i), self.value(comp.name, inst.name, i))
        elif op == "tuple":
            k = 0
            for operand in operands:
                for j in range(len(array_leaves(operand.shape))):
                    self._view(self.value(comp.name, operand.name, j), self.value(comp.name, inst.name, k))
                    k += 1
        elif op in ("bitcast", "reshape") and self.size[self.value(comp.name, inst.name, 0)] == self.size.get(
            self.value(comp.name, operands[0].name, 0)
        ):
            self.uf.union(self.value(comp.name, operands[0].name, 0), self.value(comp.name, inst.name, 0))
            if (comp.name, operands[0].name) in self.fused:
                self.fused.add((comp.name, inst.name))  # a view of a value computed in its consumers
        elif op == "transpose" and self._transposes_a_parameter(comp, inst):
            # Layout assignment gives a transpose the layout that makes it a bitcast of its operand
            # (`ChooseOutputLayoutFromOperandLayout`), and an entry parameter's layout is fixed: the
            # transposed value is the parameter's own buffer, physically unmoved. MaxText's stacked
            # weights (`param_scan_axis=1`) reach the scan this way; XLA:TPU's buffer assignment gives
            # them no allocation beside the parameter's.
            self.uf.union(self.value(comp.name, operands[0].name, 0), self.value(comp.name, inst.name, 0))
        elif op == "parameter":
            loop = self.body_of.get(comp.name)
            if loop is None:
                if comp.name == self.module.entry_name:
                    for i in range(len(leaves)):
                        self.allocating.add(self.value(comp.name, inst.name, i))
                return
            for i in range(len(leaves)):
                self.uf.union(self.value(comp.name, inst.name, i), self._loop_value(loop, i))
        elif op == "while":
            self._define_while(comp, inst, operands[0])
        elif (
            op == "dynamic-update-slice"
            and len(comp.users(operands[0].name)) == 1
            and self.size.get(self.value(comp.name, operands[0].name, 0))
            == self.size[self.value(comp.name, inst.name, 0)]
        ):
            # Updated in place: the operand dies here and has the same layout.
            self.uf.union(self.value(comp.name, operands[0].name, 0), self.value(comp.name, inst.name, 0))
        elif materialises(comp, inst, self.accelerator):
            for i in range(len(leaves)):
                self.allocating.add(self.value(comp.name, inst.name, i))
        elif op in FUSIBLE and self.accelerator:
            self.fused.add((comp.name, inst.name))

    def _transposes_a_parameter(self, comp: Computation, inst: Instruction) -> bool:
        """An accelerator's transpose of an entry parameter, held at the parameter's size per device."""
        if not self.accelerator or comp.name != self.module.entry_name:
            return False
        operand = comp[inst.operands[0]]
        return (
            operand.opcode == "parameter"
            and self.size.get(self.value(comp.name, operand.name, 0)) == self.size[self.value(comp.name, inst.name, 0)]
        )

    def _view(self, source: Value, view: Value) -> None:
        """A view shares its source's buffer, unless the sharding changes: then it is a resharded copy."""
        if self.size.get(source) == self.size[view]:
            self.uf.union(source, view)
        else:
            self.allocating.add(view)

    def _loop_value(self, loop: Instruction, leaf: int) -> Value:
        home = self.module.home_of(loop.name)
        return self.value(home, loop.name, leaf)

    def _define_while(self, comp: Computation, inst: Instruction, init: Instruction) -> None:
        body = self.module.computation(inst.attr("body").names[0])
        cond = self.module.computation(inst.attr("condition").names[0])
        root = body.root
        dropped = dead_pass_through(body, cond)
        invariant = invariant_elements(body)
        order = {x.name: k for k, x in enumerate(comp.instructions)}
        taken: set[Value] = set()  # an init buffer feeds at most one carried element; XLA copies the rest
        parameter_values = self._entry_parameter_values()  # carried elements are never parameters: fixed here
        for i in range(len(array_leaves(inst.shape))):
            carried = self.value(comp.name, inst.name, i)
            init_value = self.value(comp.name, init.name, i)
            if i in dropped:
                # XLA's while-loop simplifier removes an element the body only passes
                # along: the loop's result there is the init value itself.
                self.uf.union(init_value, carried)
                continue
            self.allocating.add(carried)
            self.loop_of[carried] = inst.name
            self.uf.union(carried, self.value(body.name, root.name, i))
            init_root = self.uf.find(init_value)
            from_parameter = any(self.uf.find(v) == init_root for v in parameter_values)
            read_later = False
            if init.opcode == "tuple" and i < len(init.operands):
                source = init.operands[i]
                read_later = any(order[u] > order[inst.name] for u in comp.users(source))
            # XLA copies an init element that is an entry parameter, is read after the
            # loop, feeds another element too, or arrives in another layout.
            same_layout = self.size.get(init_value) == self.size[carried]
            # A read-only element needs no copy (XLA's copy insertion copies only the
            # elements a body writes): the loop reads the init in place, an entry
            # parameter (a stacked weight the body slices per layer) included.
            if i in invariant and same_layout:
                self.uf.union(init_value, carried)
                continue
            if not from_parameter and not read_later and same_layout and init_root not in taken:
                taken.add(init_root)
                self.uf.union(init_value, carried)

    def is_parameter(self, v: Value) -> bool:
        return self.module.computation(v[0])[v[1]].opcode == "parameter"

    def _entry_parameter_values(self) -> list[Value]:
        """Entry parameter leaves that need memory: a few per module, so scanning them beats scanning a set."""
        entry = self.module.entry
        return [
            v
            for p in entry.parameters
            for i in range(len(array_leaves(p.shape)))
            if (v := (entry.name, p.name, i)) in self.allocating
        ]


# A reduction, views of what is ready (no computation of their own) and constants (there from the start)
# are ready with their inputs.
_READY_WITH_INPUTS = frozenset({"reduce", "bitcast", "reshape", "get-tuple-element", "constant"})


def read_ends(
    comp: Computation, fused: set[tuple[str, str]] | frozenset[tuple[str, str]], positions: dict[str, int]
) -> dict[str, int]:
    """Per instruction of `comp`, the last position at which its reads happen: its own, or for an
    instruction fused into its consumers, the last position any of them runs at. A chain fused into a
    consumer far down the computation (fusion recomputes a cheap op in each of its consumers) keeps
    what it reads live until that consumer.

    Except a reduction reached through such a chain: it runs as soon as what it reads is ready, wherever
    the program text puts it (a reduction reading a stored value directly still reads it in place).
    It turns a large input into a small output, so a scheduler that watches memory (XLA's do) issues it
    early rather than keep the input live. JAX writes a loss's log-softmax sum after the whole backward
    pass; read there, MaxText's `[batch, seq, vocab]` logits would stay live through it.
    """
    ready: dict[str, int] = {}  # where an instruction could run at the earliest: its inputs' definitions
    for inst in sorted(comp.instructions, key=lambda i: positions[i.name]):
        computed_anywhere = (comp.name, inst.name) in fused or inst.opcode in _READY_WITH_INPUTS
        earliest = max((ready[o] for o in inst.operands if o in ready), default=0)
        ready[inst.name] = earliest if computed_anywhere else positions[inst.name]
    ends: dict[str, int] = {}
    for inst in sorted(comp.instructions, key=lambda i: -positions[i.name]):
        end = positions[inst.name]
        if (comp.name, inst.name) in fused:
            # Computed inside its consumers: its reads happen where they run, not where the text puts it.
            end = max(
                ready[reader] if comp[reader].opcode == "reduce" else ends[reader] for reader in comp.users(inst.name)
            )
        ends[inst.name] = end
    return ends


def dead_pass_through(body: Computation, cond: Computation) -> set[int]:
    """Carried elements the body returns unchanged and nothing in the loop reads."""
    root = body.root
    if root.opcode != "tuple" or not body.parameters:
        return set()
    param = body.parameters[0].name
    read: dict[int, int] = {}
    for comp in (body, cond):
        params = comp.parameters
        if not params:
            continue
        for user in comp.users(params[0].name):
            u = comp[user]
            if u.opcode != "get-tuple-element":
                return set()  # the whole tuple is read: keep everything
            index = u.attr("index")
            readers = comp.users(u.name)
            passes_along = comp is body and readers == (root.name,) and root.operands.count(u.name) == 1
            if not passes_along or root.operands.index(u.name) != index:
                read[index] = read.get(index, 0) + 1
    dropped = set()
    for i, operand in enumerate(root.operands):
        inst = body[operand]
        if (
            inst.opcode == "get-tuple-element"
            and inst.operands[0] == param
            and inst.attr("index") == i
            and i not in read
        ):
            dropped.add(i)
    return dropped


def reads_leaf(comp: Computation, user: Instruction, leaf: int) -> bool:
    """Whether `user` reads leaf `leaf` of its operand (a value's use, as XLA's dataflow counts it).

    A get-tuple-element reads only the tuple's table of pointers: the elements it does not select are
    not used by it. Without this, a tuple's late get-tuple-element of one element would keep every
    other element alive to that point. Example: XLA's dump writes the log-softmax's three results as
    `%t#0`, `%t#1`, `%t#2` operands, each read where it is needed; the get-tuple-element of `#1` just
    before the backward's use must not hold `#0`'s f32[B,S,V] logits through the peak between them.
    """
    if user.opcode != "get-tuple-element":
        return True
    source = comp[user.operands[0]].shape
    if not isinstance(source, TupleShape):
        return True
    base = leaf_offsets(source)[user.attr("index")]
    return base <= leaf < base + len(array_leaves(user.shape))


def _only_reader(comp: Computation, members: set[Value]) -> str | None:
    """The one instruction of `comp` that reads the buffer whose values in `comp` are `members`
    (outside the views that share it), or None when there are several or none."""
    found: set[str] = set()
    for _, name, leaf in members:
        for user in comp.users(name):
            u = comp[user]
            if not reads_leaf(comp, u, leaf):
                continue
            if any((comp.name, user, k) in members for k in range(len(array_leaves(u.shape)))):
                continue
            found.add(user)
    return next(iter(found)) if len(found) == 1 else None
