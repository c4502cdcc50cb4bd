"""The propagation pass (XLA's ShardingPropagation::Run), step by step.

1. Sharding custom-calls become annotated copies; `shard_as`/`shard_like`
   tags are collected into groups.
2. While/call/conditional nodes and their computations' roots and parameters
   are tied (one sharding between them).
3. Annotated nodes (and the entry root and parameters unless propagation to
   them is allowed) are frozen.
4. At aggressiveness 0..3, iterate to a fixed point: shard groups, a forward
   pass in post order, a backward pass in reverse post order.
5. `shard_as` groups are forced to one common sharding, then one more pass.
6. Outputs and parameters that may not change get their shardings back.

The fixed point is a worklist over XLA's order: see `worklist.py`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from planner.errors import PlanningError
from planner.hlo.ir.module import Attribute, HloModule
from planner.prepare.propagation_options import PropagationOptions
from planner.propagation.gspmd.backward import infer_from_users
from planner.propagation.gspmd.context import Context
from planner.propagation.gspmd.forward import infer_from_operands
from planner.propagation.gspmd.outputs import restore_fixed_outputs
from planner.propagation.gspmd.worklist import index_readers, tested_between
from planner.propagation.shared.graph import BACKWARD, FORWARD, Graph, Node, Provenance
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding

# A guard: XLA's fixed point always terminates; a bug here must not hang.
_MAX_ITERATIONS = 10_000
WORKLIST_VARIABLE = "SPMD_PLANNER_WORKLIST"
# The inference of each direction (graph.FORWARD, graph.BACKWARD).
_RULES: tuple[Callable[[Context, Node], bool], ...] = (infer_from_operands, infer_from_users)


class Propagator:
    def __init__(self, module: HloModule, options: PropagationOptions) -> None:
        self.graph = Graph(module)
        self.ctx = Context(self.graph, options)
        self.groups: dict[int, list[Node]] = {}
        self.group_kind: dict[int, bool] = {}  # id -> shard_as
        self.group_of: dict[int, int] = {}  # id(node) -> group id
        self.renamed: dict[str, str] = {}
        # The last node whose sharding changed: named if the fixed point is never reached.
        self.last_changed: Node | None = None
        mode = os.environ.get(WORKLIST_VARIABLE, "on")
        if mode not in ("on", "off", "check"):
            raise ValueError(f"{WORKLIST_VARIABLE}={mode!r}: expected on, off or check")
        self.skipping = mode != "off"
        self.checking = mode == "check"

    # -- set-up ---------------------------------------------------------------

    def process_sharding_instructions(self) -> None:
        g = self.graph
        for comp in list(g.computations):
            for node in reversed(g.post_order(comp)):
                if node.computation != comp or not g.contains(node):
                    continue
                if node.is_custom_call("Sharding"):
                    self._process_sharding_call(node)
                else:
                    self._register_group(node)

    def _process_sharding_call(self, node: Node) -> None:
        g = self.graph
        s = node.sharding
        operand = node.operands[0]
        if s is None:
            return
        replaced = not s.is_unknown or operand.opcode == "parameter"
        if replaced:
            old = node.name
            node.opcode = "copy"
            node.name = g.fresh_name("copy")
            self.renamed[old] = node.name
            node.provenance = Provenance("annotation", (old,))
            # The copy is a new user of the operand, appended after the others.
            operand.users = [u for u in operand.users if u is not node] + [node]
        if s.shard_group is not None and not replaced:
            # A group-only annotation moves its tag onto the operand and goes away.
            if not self.ctx.options.shard_groups:
                self.renamed[node.name] = operand.name
                g.replace_uses(node, operand)
                return
            base = operand.sharding or HloSharding.unknown()
            operand.sharding = base.with_shard_group(s.shard_group)
            operand.provenance = Provenance("shard group annotation", (node.name,))
            self.renamed[node.name] = operand.name
            g.replace_uses(node, operand)
            return
        self._register_group(node)
        unspecified = _unspecified_dims(node)
        if unspecified is not None:
            self.ctx.unspecified_dims[id(node)] = unspecified
        elif operand.sharding is None:
            operand.sharding = node.sharding
            operand.provenance = Provenance("annotation on user", (node.name,))

    def _register_group(self, node: Node) -> None:
        s = node.sharding
        if s is None or s.is_tuple or s.shard_group is None:
            return
        group = s.shard_group
        node.sharding = s.with_shard_group(None)
        if not self.ctx.options.shard_groups:
            return
        self.groups.setdefault(group.id, []).append(node)
        self.group_kind[group.id] = group.shard_as
        self.group_of[id(node)] = group.id

    def tie_called_computations(self) -> None:
        g = self.graph
        for comp, nodes in g.computations.items():
            for node in nodes:
                if node.opcode not in ("while", "conditional", "call"):
                    continue
                related = self.related(node)
                first = next((r for r in related if r.sharding is not None), None)
                if first is not None:
                    for r in related:
                        r.sharding = first.sharding
                        r.provenance = Provenance("tied to called computation", (first.name,))
                if node.opcode == "while":
                    body, cond = node.inst.attr("body").names[0], node.inst.attr("condition").names[0]
                    self.ctx.computation_map[body] = node
                    self.ctx.computation_map[cond] = node
                else:
                    for called in node.called:
                        self.ctx.computation_map[called] = node
            del comp

    def related(self, node: Node) -> list[Node]:
        g = self.graph
        if node.opcode == "while":
            body, cond = node.inst.attr("body").names[0], node.inst.attr("condition").names[0]
            return [node, g.root(body), g.parameters(body)[0], g.parameters(cond)[0]]
        if node.opcode == "conditional":
            return [node, *(g.root(c) for c in node.called)]
        if node.opcode == "call":
            return [node, g.root(node.called[0])]
        if node.opcode == "parameter":
            caller = self.ctx.computation_map.get(node.computation)
            if caller is not None and caller.opcode == "conditional":
                branch = caller.called.index(node.computation)
                return [node, caller.operands[branch + 1]]
            if caller is not None and caller.opcode == "call":
                return [node, caller.operands[node.inst.parameter_number or 0]]
        return []

    def freeze(self) -> None:
        g, ctx = self.graph, self.ctx
        entry_root = g.root(g.entry)
        for node in g.nodes():
            s = node.sharding
            if s is not None and not s.is_unknown and node is not entry_root and node.opcode != "parameter":
                ctx.provided.add(id(node))
        if not ctx.allow_output and (entry_root.sharding is None or not entry_root.sharding.is_unknown):
            ctx.provided.add(id(entry_root))
        if not ctx.allow_parameters:
            for param in g.parameters(g.entry):
                if param.sharding is not None and not param.sharding.is_unknown:
                    ctx.provided.add(id(param))
        for node in g.nodes():
            if node.sharding is not None and _has_unknown(node.sharding):
                node.sharding = _unknown_to_replicated(node.sharding)

    # -- the fixed point ----------------------------------------------------

    def run_to_fix_point(self, aggressiveness: int) -> None:
        g, ctx = self.graph, self.ctx
        ctx.aggressiveness = level = aggressiveness
        done_group: set[int] = set()
        done_fwd: set[int] = set()
        done_bwd: set[int] = set()

        def clear_cache(node: Node) -> None:
            for operand in node.operands:
                done_bwd.discard(id(operand))
            for user in node.users:
                done_fwd.discard(id(user))
                for called in user.called:
                    if called in g.computations:
                        for p in g.parameters(called):
                            done_fwd.discard(id(p))
            group = self.group_of.get(id(node))
            if group is not None:
                for member in self.groups[group]:
                    if member is not node:
                        done_group.discard(id(member))

        def after_change(node: Node) -> None:
            self.last_changed = node
            changed: list[Node] = []
            self.computation_propagation(node, changed)
            clear_cache(node)
            for h in changed:
                clear_cache(h)

        dones = (done_fwd, done_bwd)
        refines = (self.unspecified_from_operand, self.unspecified_from_users)

        def phase(nodes: Iterable[Node], direction: int) -> bool:
            """One forward or backward sweep; frozen nodes only refine unspecified dims."""
            done, rule, refine = dones[direction], _RULES[direction], refines[direction]
            changed = False
            for node in nodes:
                if id(node) in done:
                    continue
                if ctx.is_provided(node):
                    if self._refinable(node) and refine(node):
                        after_change(node)
                        done.add(id(node))
                        changed = True
                    continue
                done.add(id(node))
                visit = node.visits[direction]
                if visit.current and not tested_between(visit.levels_read, visit.level, level):
                    if self.checking:
                        self._check_no_op(node, rule, direction, level)
                    continue
                visit.current = True
                ctx.levels_read = 0
                if rule(ctx, node):
                    visit.current = False
                    after_change(node)
                    changed = True
                else:
                    visit.current = self.skipping and visit.current
                visit.level, visit.levels_read = level, ctx.levels_read
            return changed

        changed_last = True
        while changed_last:
            ctx.iteration += 1
            if ctx.iteration > _MAX_ITERATIONS:
                raise self._no_fixed_point()
            changed_last = False
            for comp in list(g.computations):
                order = g.post_order(comp)
                for node in order:
                    gid = self.group_of.get(id(node))
                    if gid is None or id(node) in done_group or ctx.is_provided(node):
                        continue
                    done_group.add(id(node))
                    if self.infer_from_group(node, gid):
                        after_change(node)
                        changed_last = True
                changed_last |= phase(order, FORWARD)
                changed_last |= phase(reversed(order), BACKWARD)

    def _check_no_op(self, node: Node, infer: Callable[[Context, Node], bool], direction: int, level: int) -> None:
        """A skipped inference, run anyway: it must change nothing (SPMD_PLANNER_WORKLIST=check)."""
        before = (node.sharding, node.provenance)
        if infer(self.ctx, node) or (node.sharding, node.provenance) != before:
            raise AssertionError(
                f"the worklist skipped the {('forward', 'backward')[direction]} inference of {node.name} "
                f"({node.opcode}) at level {level}, but it changes {before[0]} to {node.sharding}"
            )

    def _no_fixed_point(self) -> PlanningError:
        node = self.last_changed
        what = (
            "no instruction changed"
            if node is None
            else (
                f"'{node.name}' ({node.opcode} in computation '{node.computation}', line {node.inst.line}) kept "
                f"changing, last to {node.sharding.to_text() if node.sharding is not None else 'no sharding'}"
            )
        )
        return PlanningError(f"sharding propagation did not reach a fixed point in {_MAX_ITERATIONS:,} "
                             f"iterations at aggressiveness {self.ctx.aggressiveness}: {what}")  # fmt: skip

    def _refinable(self, node: Node) -> bool:
        """A frozen partial annotation may still learn its unspecified dims."""
        return self.ctx.combine_partial and id(node) in self.ctx.unspecified_dims

    def unspecified_from_operand(self, node: Node) -> bool:
        """InferUnspecifiedDimsFromOperand: a partial annotation learns its open dims."""
        operand = node.operands[0]
        s = operand.sharding
        if s is None or not s.is_tiled or node.sharding is None:
            return False
        partial = algebra.partially_replicate_all_except(s, self.ctx.unspecified_dims[id(node)])
        merged = algebra.merge_if_compatible(partial, node.sharding)
        if merged is None:
            return False
        self.ctx.set(node, merged, "unspecified dims from operand", (operand,))
        return True

    def unspecified_from_users(self, node: Node) -> bool:
        from planner.propagation.gspmd.backward import sharding_from_user

        changed = False
        for user in node.users:
            if user.sharding is None or not user.sharding.is_tiled or node.sharding is None:
                continue
            s = sharding_from_user(self.ctx, node, user)
            if s is None or s.is_tile_maximal or s.is_tuple:
                continue
            partial = algebra.partially_replicate_all_except(s, self.ctx.unspecified_dims[id(node)])
            merged = algebra.merge_if_compatible(partial, node.sharding)
            if merged is not None:
                self.ctx.set(node, merged, "unspecified dims from user", (user,))
                changed = True
        return changed

    def infer_from_group(self, node: Node, gid: int) -> bool:
        ctx = self.ctx
        if not ctx.can_propagate_at_level(node):
            return False
        if node.sharding is not None and node.sharding.is_manual:
            return False
        members = [m for m in self.groups[gid] if m is not node]
        if node.sharding is None or node.sharding.is_tile_maximal:
            for m in members:
                if m.sharding is not None and m.sharding.is_manual:
                    ctx.set(node, m.sharding, "shard group (manual)", (m,))
                    return True
        changed = False
        for m in members:
            if m.sharding is not None:
                changed |= ctx.improve(node, m.sharding, f"shard group {gid}", (m,))
        return changed

    def computation_propagation(self, node: Node, changed: list[Node]) -> None:
        """MaybeComputationPropagation: copy a tied sharding to its partners."""
        ctx = self.ctx

        def propagate(search: Node) -> None:
            related = self.related(search)
            if node not in related:
                return
            for r in related:
                if r is node or ctx.is_provided(r):
                    continue
                if r.sharding is None or r.sharding != node.sharding:
                    assert node.sharding is not None
                    ctx.set(r, node.sharding, "tied to called computation", (node,))
                    changed.append(r)
                    self.computation_propagation(r, changed)

        if node.opcode in ("conditional", "while", "custom-call", "call"):
            propagate(node)
        comp = node.computation
        caller = ctx.computation_map.get(comp)
        if caller is not None and (node.opcode == "parameter" or node is self.graph.root(comp)):
            propagate(caller)
            if node.opcode == "parameter" and caller.opcode in ("conditional", "call"):
                propagate(node)

    def align_shard_as_groups(self) -> None:
        for gid, members in self.groups.items():
            if not self.group_kind[gid]:
                continue
            shardings = [m.sharding for m in members if m.sharding is not None]
            default = HloSharding.replicate()
            for s in shardings:
                if default.is_replicated:
                    default = s
            common = default if not shardings else algebra.find_common_sharding(shardings, default)
            # The member whose own sharding became the common one is the origin.
            origin = next((m for m in members if m.sharding == common), None)
            for m in members:
                if m.sharding == common and m.provenance is not None:
                    continue
                sources = (origin,) if origin is not None and origin is not m else ()
                self.ctx.set(m, common, f"shard_as group {gid} aligned", sources)

    def run(self) -> None:
        g, ctx = self.graph, self.ctx
        for node in g.nodes():
            # Leftovers of an earlier CSE-prevention run are not annotations.
            if (
                node.sharding is not None
                and node.sharding.metadata
                and all(_CSE_PREVENTION in m for m in node.sharding.metadata)
            ):
                node.sharding = None
                node.provenance = None
        self.process_sharding_instructions()
        root = g.root(g.entry)
        saved_root = root.sharding if ctx.allow_output else None
        saved_params = (
            {i: p.sharding for i, p in enumerate(g.parameters(g.entry)) if p.sharding is not None}
            if ctx.allow_parameters
            else {}
        )
        self.tie_called_computations()
        if root.opcode == "while" and not ctx.allow_output:
            self._copy_above_entry_root(root)
        self.freeze()
        if self.skipping:
            index_readers(self.graph, self.ctx)
        for aggressiveness in range(4):
            self.run_to_fix_point(aggressiveness)
        if any(self.group_kind.values()):
            self.align_shard_as_groups()
            self.run_to_fix_point(3)
        restore_fixed_outputs(g, ctx, saved_root, saved_params)
        self._remove_shard_barriers()

    def _remove_shard_barriers(self) -> None:
        for node in list(self.graph.nodes()):
            if node.is_custom_call("ShardBarrierFrom") or node.is_custom_call("ShardBarrierTo"):
                self.renamed[node.name] = node.operands[0].name
                self.graph.replace_uses(node, node.operands[0])

    def _copy_above_entry_root(self, root: Node) -> None:
        g = self.graph
        from planner.hlo.ir.module import Instruction

        attrs = (Attribute("sharding", root.sharding, ""),) if root.sharding is not None else ()
        inst = Instruction(g.fresh_name("copy"), "copy", root.shape, (root.name,), attrs)
        copy = Node(inst, root.computation)
        copy.sharding = root.sharding
        copy.operands = [root]
        root.users.append(copy)
        g.computations[root.computation].append(copy)
        g.roots[root.computation] = copy
        g.structure_changed()


_CSE_PREVENTION = "_sharding_propagation_cse_prevention"


def _unspecified_dims(node: Node) -> tuple[int, ...] | None:
    """`backend_config="unspecified_dims=[0,2]"` on a Sharding custom-call."""
    import re

    config = node.inst.attr("backend_config")
    if not isinstance(config, str):
        return None
    m = re.search(r"unspecified_dims=\[([\d,\s]*)\]", config)
    if m is None:
        return None
    return tuple(sorted(int(d) for d in m.group(1).split(",") if d.strip()))


def _has_unknown(s: HloSharding) -> bool:
    return s.is_unknown if not s.is_tuple else any(e.is_unknown for e in s.elements)


def _unknown_to_replicated(s: HloSharding) -> HloSharding:
    if s.is_tuple:
        return HloSharding.tuple_of(tuple(HloSharding.replicate() if e.is_unknown else e for e in s.elements))
    return HloSharding.replicate() if s.is_unknown else s
