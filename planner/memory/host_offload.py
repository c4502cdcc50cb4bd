"""Host offload: the buffers XLA's host offloader places in host memory, which hold no HBM.

JAX writes an offload as `custom-call @annotate_device_placement` with `_xla_buffer_placement="pinned_host"`
(a remat policy's `save_and_offload_only_these_names`, `jax.device_put(x, memory_kind="pinned_host")`)
and its way back with `"device"`; XLA turns them into its `MoveToHost` and `MoveToDevice` calls and its
host offloader (xla/service/host_offloader.cc) gives host memory space (`S(5)`) to every buffer on the way
from one to the other:
- from a `MoveToHost`, through bitcasts, copies and bitcast reshapes, to the dynamic-update-slice it
  writes into (`GetStartingInstructions`): the stacked buffer a scan saves each layer's residual in, with
  the broadcast that allocates it (`CreateAllocateBufferForDynamicUpdateSlice`) and every tuple, loop
  element and get-tuple-element that carries it on, down to the dynamic-slice that reads one layer back
  (`WalkDownHostMemoryOffloadPaths`: a slice ends the path; its result is on the device);
- a `MoveToHost` that writes into no dynamic-update-slice copies its whole operand to host memory, and
  the copy is carried on the same way to its `MoveToDevice`.
The calls themselves move no buffer of the device's: the slice a layer offloads is written from where it
is computed (the update becomes a host DMA), and what comes back is the slice's own buffer. In the buffer
model each call is therefore a view of its operand, and the host holds the buffers those paths reach;
their bytes are reported as host memory, beside HBM, never in it.
"""

from __future__ import annotations

from planner.hlo.ir.module import Computation, Instruction

ANNOTATE = "annotate_device_placement"
PLACEMENT = "_xla_buffer_placement"
TO_HOST, TO_DEVICE = "MoveToHost", "MoveToDevice"
_PINNED_HOST = "pinned_host"
# What passes between a MoveToHost and the dynamic-update-slice it writes into (`InstructionIsAllowedBetween-
# MoveToHostAndDus`: a reshape only when it is a bitcast, which a same-size reshape is here).
_BETWEEN = frozenset({"bitcast", "copy", "reshape"})


def movement(inst: Instruction) -> str | None:
    """`MoveToHost` or `MoveToDevice` for an offload call (JAX's annotation or XLA's own), else None."""
    if inst.opcode != "custom-call":
        return None
    target = inst.attr("custom_call_target")
    if target in (TO_HOST, TO_DEVICE):
        return str(target)
    if target != ANNOTATE:
        return None
    attributes = inst.attr("frontend_attributes")
    placement = attributes.get(PLACEMENT) if attributes is not None else None
    return TO_HOST if placement == _PINNED_HOST else TO_DEVICE


def offload_starts(comp: Computation, move: Instruction) -> list[tuple[str, bool]]:
    """Where `move` (a MoveToHost) starts host memory: (instruction, written into) for each dynamic-update-
    slice it writes its operand into, or (the call itself, False) when it copies the operand whole."""
    starts: list[tuple[str, bool]] = []
    stack = [move.name]
    seen = {move.name}
    while stack:
        name = stack.pop()
        for user in comp.users(name):
            inst = comp[user]
            if inst.opcode == "dynamic-update-slice" and inst.operands[1] == name:
                starts.append((user, True))
            elif inst.opcode in _BETWEEN and user not in seen:
                seen.add(user)
                stack.append(user)
    return starts or [(move.name, False)]
