"""Capture one training step as the planner reads it: the step's HLO, plus a manifest.

The step is traced, not run: torch_xla records the forward, the backward and
(given the optimizer) the optimizer's update lazily; `_get_xla_tensors_hlo`
prints the pending graph (with every sharding annotation, before
partitioning), and the trace is dropped without executing. The manifest says
which output is whose gradient and each parameter's partition spec over the
mesh's axis names, read back from torch_xla.

With the optimizer, the graph is the one `torch_xla.sync()` compiles for a
step of the loop `zero_grad(); loss.backward(); optimizer.step(); sync()`:
its outputs are the loss, the gradients (alive until the next `zero_grad`),
the updated parameters and optimizer state and the other pending tensors the
step keeps alive, and its `buffer_donor` entries are the buffers torch_xla
would donate by its own rule (see `_donated`).

The capture is read-only. The optimizer's update is in place, so it is traced
on stand-ins: tensors over the same device buffers (same shardings, so the
same graph), put in the model's place for the forward and given to a copy of
the optimizer whose state holds stand-ins too. The model's parameters, their
gradients and the optimizer's own state are never touched, so the step that
trains next is the graph torch_xla builds without the capture.
"""

from __future__ import annotations

import copy
import gc
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch_xla
import torch_xla.core.xla_model as xm
from torch.nn.utils.stateless import _reparametrize_module

from planner.mesh import Mesh
from planner.plan.manifest import Manifest, ManifestParameter
from planner.sharding.partition_spec import spec_from_sharding
from planner.sharding.text import parse_sharding

LEFT_OUT_WITHOUT_OPTIMIZER = "the optimizer's update (auto_plan was given no optimizer=, nor gradients_only=True)"


@dataclass(frozen=True)
class CapturedStep:
    hlo: str
    manifest: Manifest


class NotCapturable(RuntimeError):
    """The step cannot be traced without running something first (a tensor still has pending work)."""


def capture_step(loss_fn: Callable[..., torch.Tensor], args: tuple[Any, ...], model: torch.nn.Module,
                 mesh: Mesh, optimizer: torch.optim.Optimizer | None = None,
                 gradients_only: bool = False) -> CapturedStep:  # fmt: skip
    """The step `loss_fn(*args)` (and `optimizer.step()` when given) as HLO and manifest; nothing is changed.

    Without the optimizer the manifest says the update is left out (`Manifest.left_out`), unless
    `gradients_only` says the step trained has none."""
    named: list[tuple[str, torch.Tensor]] = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    seed = xm.get_rng_state()
    unannotated = _unannotated(model, optimizer)
    try:
        if optimizer is None:
            loss = _scalar(loss_fn(*args))
            grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
            kept = [(name, p, g) for (name, p), g in zip(named, grads) if g is not None]
            hlo = torch_xla._XLAC._get_xla_tensors_hlo([loss, *(g for _, _, g in kept)])
            count = 1 + len(kept)
        else:
            kept, hlo, count = _whole_step(loss_fn, args, model, named, optimizer)
    finally:
        for t in unannotated:
            torch_xla._XLAC._xla_clear_sharding(t)
    if xm.get_rng_state() != seed:  # random ops traced in the step drew seeds the step itself must draw
        xm.set_rng_state(seed)
    parameters = [
        ManifestParameter(name=name, shape=list(p.shape), partition_spec=_spec(p, mesh)) for name, p, _ in kept
    ]
    # The loss, then each gradient; the updated parameters and state after them are nobody's gradient.
    names = [None, *(name for name, _, _ in kept)]
    # Without the optimizer, the module is the loss and gradients only: the update that reads them is left out.
    left_out = None if optimizer is not None or gradients_only else LEFT_OUT_WITHOUT_OPTIMIZER
    manifest = Manifest(outputs=names + [None] * (count - len(names)), parameters=parameters, left_out=left_out)
    return CapturedStep(hlo, manifest)


def _scalar(loss: Any) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError("the step function must return the scalar loss")
    return loss


def _whole_step(
    loss_fn: Callable[..., torch.Tensor],
    args: tuple[Any, ...],
    model: torch.nn.Module,
    named: list[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
) -> tuple[list[tuple[str, torch.Tensor, torch.Tensor]], str, int]:
    """Forward, backward and the optimizer's update traced on stand-ins; its HLO with the donated buffers."""
    # Buffers of the previous step may still be being written: their device data is a placeholder until then.
    xm.wait_device_ops()
    stand_in: dict[int, torch.Tensor] = {}
    originals: dict[int, torch.Tensor] = {}  # stand-in's id -> a tensor over the same buffer, kept as it is
    for name, p in model.named_parameters():
        kept_as_is = _device_data(p, name)
        # Made last, the stand-in is the tensor its buffer records (see `_donated`).
        stand_in[id(p)] = _annotated_as(p, _same_buffer(p)).requires_grad_(p.requires_grad)
        originals[id(stand_in[id(p)])] = kept_as_is
    shadow = _shadow_optimizer(optimizer, stand_in, originals)
    try:
        with _reparametrize_module(model, {n: stand_in[id(p)] for n, p in model.named_parameters()}, tie_weights=True):
            loss = _scalar(loss_fn(*args))
        trained = [stand_in[id(p)] for _, p in named]
        grads = torch.autograd.grad(loss, trained, allow_unused=True)
        for t, g in zip(trained, grads):
            t.grad = g
        kept = [(name, p, g) for (name, p), g in zip(named, grads) if g is not None]
        type(shadow).step(shadow)  # the class's step: a scheduler's wrapper on the instance counts real steps
        updated = [t for t in (*stand_in.values(), *_state_tensors(shadow)) if _on_xla(t) and _changed(t)]
        outputs = [loss, *(g for _, _, g in kept), *updated]
        outputs += _also_live(outputs)
        hlo = torch_xla._XLAC._get_xla_tensors_hlo(outputs)
        return kept, _with_donors(hlo, outputs, _donated(outputs, list(originals.values()))), len(outputs)
    finally:
        _give_back(model, optimizer)


def _donated(outputs: list[torch.Tensor], buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    """The buffers torch_xla's sync of `outputs` would donate.

    At a step barrier torch_xla donates an input buffer when the tensor the buffer records as its
    owner (the last tensor made over it) is among the tensors the sync writes, matched by alias id
    (`GetBufferDonorIndexForStepMarker`). A parameter whose update writes it is its buffer's owner
    and donates it, unless something made another tensor over the buffer since: torch_xla's scan does
    for the weights it reads, so stacked layer weights keep their buffers.
    """
    writes = {_alias_id(t) for t in outputs}
    return [b for b in buffers if _recorded_owner(b) in writes]


def _alias_id(t: torch.Tensor) -> int:
    info = torch_xla._XLAC._get_xla_tensor_debug_info(t)
    found = re.search(r"^AliasID: (\d+)", info, re.M)
    return int(found.group(1)) if found else torch_xla._XLAC._xla_get_tensor_id(t)


def _recorded_owner(buffer: torch.Tensor) -> int:
    """The tensor id `buffer`'s device data records (reading it makes one more tensor over the buffer)."""
    ids, _ = torch_xla._XLAC._get_tensors_xla_device_data_node([buffer])
    return int(ids[0])


def _also_live(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pending tensors the step keeps alive besides `outputs`: `torch_xla.sync()` computes those too.

    A sync's outputs are every live tensor with pending work, not only the ones the loop reads: e.g.
    torch_xla's scan keeps the stacked weights on its autograd node, which the loss keeps alive, so a
    step that holds its loss until the sync also writes them out. Tensors only reachable from garbage
    are collected first, as they would be by then.
    """
    gc.collect()
    known = {id(t) for t in outputs}
    live = []
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and id(obj) not in known and _on_xla(obj) and _changed(obj):
            known.add(id(obj))
            live.append(obj)
    return live


def _shadow_optimizer(
    optimizer: torch.optim.Optimizer, stand_in: dict[int, torch.Tensor], originals: dict[int, torch.Tensor]
) -> torch.optim.Optimizer:
    """A copy of `optimizer` over the stand-ins, its state stand-ins too: its step changes nothing real."""
    shadow = copy.copy(optimizer)  # the same class, hyperparameters and hooks
    shadow.param_groups = [
        {**group, "params": [stand_in[id(p)] for p in group["params"]]} for group in optimizer.param_groups
    ]
    state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
    for p, values in optimizer.state.items():
        copied = {}
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and _on_xla(value):
                kept_as_is = _device_data(value, f"the optimizer's {key!r}")
                copied[key] = _annotated_as(value, _same_buffer(value))
                originals[id(copied[key])] = kept_as_is
            elif isinstance(value, torch.Tensor):
                copied[key] = value.clone()  # e.g. AdamW's step count, kept on the host
            else:
                copied[key] = copy.deepcopy(value)
        state[stand_in[id(p)]] = copied
    shadow.state = state
    return shadow


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for values in optimizer.state.values() for v in values.values() if isinstance(v, torch.Tensor)]


def _on_xla(t: torch.Tensor) -> bool:
    return t.device.type == "xla"


def _changed(t: torch.Tensor) -> bool:
    """Whether `t` is a pending computation (the step updated it), not only the buffer it holds."""
    info = torch_xla._XLAC._get_xla_tensor_debug_info(t)
    ir = next((line for line in info.splitlines() if line.startswith("IR:")), "IR: None")
    return ir != "IR: None" and "xla::device_data" not in ir


def _give_back(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Each buffer owned again by its own tensor.

    A buffer records the last tensor made over it, and torch_xla donates a buffer to the update of the
    tensor it records; after the stand-ins, that is a stand-in. A tensor made over the buffer anew and
    put in place of the original (`_replace_xla_tensor`) makes the record name the original again.
    """
    owned = [*model.parameters(), *_state_tensors(optimizer)]
    for t in owned:
        if _on_xla(t):
            torch_xla._XLAC._replace_xla_tensor(t, _same_buffer(t))


def _unannotated(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The parameters and optimizer state with no sharding annotation of their own, to be left so.

    Tracing a tensor over a buffer, or making another over it, gives the tensor its buffer's sharding as
    its annotation, `{replicated}` for one never marked, and torch_xla writes that annotation into every
    graph that updates the tensor in place (a `Sharding` custom call). In the step as the user wrote it,
    such a tensor (a norm weight, a bias, their AdamW moments) is left to propagation, which may split it.
    """
    state = _state_tensors(optimizer) if optimizer is not None else []
    return [t for t in (*model.parameters(), *state) if _on_xla(t) and not _annotated(t)]


def _same_buffer(t: torch.Tensor) -> torch.Tensor:
    return torch_xla._XLAC._get_tensors_xla_device_data_node([t])[1][0]


def _annotated(t: torch.Tensor) -> bool:
    """Whether `t` carries a sharding of its own (marked, or given it by the step that wrote it)."""
    return bool(torch_xla._XLAC._get_xla_sharding_spec(t))


def _annotated_as(original: torch.Tensor, made: torch.Tensor) -> torch.Tensor:
    """`made`, a tensor over `original`'s buffer, annotated as `original` is.

    A tensor made over a buffer takes the buffer's sharding as its own annotation (see `_unannotated`); a
    stand-in for a tensor with none is left with none, so the captured graph is the step's own.
    """
    if not _annotated(original):
        torch_xla._XLAC._xla_clear_sharding(made)
    return made


def _device_data(t: torch.Tensor, what: str) -> torch.Tensor:
    """A new tensor over `t`'s own buffer (same sharding); refused when `t` is still a pending computation."""
    if _changed(t):
        raise NotCapturable(
            f"{what} (shape {list(t.shape)}) is still a pending computation, so the step cannot be traced "
            "from its buffer: call torch_xla.sync() before planning"
        )
    return _same_buffer(t)


_MODULE_HEADER = re.compile(r"^HloModule ([^\s,]+)", re.M)


def _with_donors(hlo: str, outputs: list[torch.Tensor], donated: list[torch.Tensor]) -> str:
    """`hlo` with `buffer_donor` naming the entry parameters that hold the `donated` buffers."""
    context = torch_xla._XLAC.lowering.LoweringContext("donors")
    context.build(outputs)
    # The lowering numbers parameters as `_get_xla_tensors_hlo` does (the same graph, the same walk); a
    # buffer the graph does not read (-1) is not a donor.
    numbered = [(context.tensor_parameter_id(d), d) for d in donated]
    donors = sorted({i for i, _ in numbered if i >= 0})
    _check_parameters(hlo, numbered)
    if not donors:
        return hlo
    listed = ", ".join(f"({i}, {{}})" for i in donors)
    return _MODULE_HEADER.sub(lambda m: f"HloModule {m.group(1)}, buffer_donor={{ {listed} }}", hlo, count=1)


def _check_parameters(hlo: str, numbered: list[tuple[int, torch.Tensor]]) -> None:
    """Each donor's entry parameter has its tensor's shape: the two numberings agree."""
    entry = hlo[hlo.index("\nENTRY") :]
    shapes = {int(n): dims for dims, n in re.findall(r"= \w+\[([\d,]*)\][^\n]*? parameter\((\d+)\)", entry)}
    for i, data in numbered:
        want = ",".join(str(n) for n in data.shape)
        if i >= 0 and shapes.get(i) != want:
            raise RuntimeError(f"entry parameter {i} is [{shapes.get(i)}], its donor tensor [{want}]: "
                               "torch_xla numbered the captured graph's parameters unlike its lowering")  # fmt: skip


def _spec(t: torch.Tensor, mesh: Mesh) -> list[Any]:
    text = torch_xla._XLAC._get_xla_sharding_spec(t)
    if not text:
        return [None] * t.dim()
    return spec_from_sharding(parse_sharding(text), t.dim(), mesh)
