"""Dot and convolution dimension roles (XLA's DotConvolutionDimsInfo).

Every dim of a dot is a batch dim (in lhs, rhs and output), a contracting dim
(lhs and rhs only), or a non-contracting dim of one side (that side and the
output). Output layout: batch dims, then lhs free dims, then rhs free dims.
A convolution whose spatial dims are trivial is a dot in disguise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.hlo.ir.attributes import ConvDimLabels, WindowDim
from planner.hlo.ir.module import Instruction


@dataclass(frozen=True, slots=True)
class DimRole:
    lhs: int = -1
    rhs: int = -1
    output: int = -1


@dataclass(frozen=True, slots=True)
class DotDims:
    batch: tuple[DimRole, ...] = ()
    contracting: tuple[DimRole, ...] = ()
    lhs_non_contracting: tuple[DimRole, ...] = ()
    rhs_non_contracting: tuple[DimRole, ...] = ()
    conv_spatial: tuple[DimRole, ...] = field(default=())


def dot_dims(inst: Instruction, lhs_rank: int, rhs_rank: int) -> DotDims:
    """ParseDotGeneralFromDot."""
    lb = inst.attr("lhs_batch_dims", ())
    rb = inst.attr("rhs_batch_dims", ())
    lc = inst.attr("lhs_contracting_dims", ())
    rc = inst.attr("rhs_contracting_dims", ())
    batch = tuple(DimRole(lb[i], rb[i], i) for i in range(len(lb)))
    contracting = tuple(DimRole(lc[i], rc[i], -1) for i in range(len(lc)))
    lhs_free = [d for d in range(lhs_rank) if d not in lb and d not in lc]
    rhs_free = [d for d in range(rhs_rank) if d not in rb and d not in rc]
    lhs_nc = tuple(DimRole(d, -1, len(lb) + k) for k, d in enumerate(lhs_free))
    rhs_nc = tuple(DimRole(-1, d, len(lb) + len(lhs_free) + k) for k, d in enumerate(rhs_free))
    return DotDims(batch, contracting, lhs_nc, rhs_nc)


def label_positions(labels: str) -> tuple[dict[str, int], list[int]]:
    named = {c: i for i, c in enumerate(labels) if not c.isdigit()}
    spatial = [i for _, i in sorted((int(c), i) for i, c in enumerate(labels) if c.isdigit())]
    return named, spatial


def conv_dims(inst: Instruction, lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...]) -> DotDims:
    """ParseConvolutionDimsInfo: classify each spatial dim as batch, contracting, free or spatial."""
    labels: ConvDimLabels = inst.attr("dim_labels")
    window: tuple[WindowDim, ...] = inst.attr("window", ())
    lhs_named, lhs_spatial = label_positions(labels.lhs)
    rhs_named, rhs_spatial = label_positions(labels.rhs)
    out_named, out_spatial = label_positions(labels.out)
    batch: list[DimRole] = []
    contracting = [DimRole(lhs_named["f"], rhs_named["i"], -1)]
    lhs_nc = [DimRole(lhs_named["b"], -1, out_named["b"])]
    rhs_nc = [DimRole(-1, rhs_named["o"], out_named["f"])]
    spatial: list[DimRole] = []
    for i, (ls, rs, os) in enumerate(zip(lhs_spatial, rhs_spatial, out_spatial)):
        wd = window[i] if i < len(window) else WindowDim(size=1)
        lhs_size, rhs_size = lhs_dims[ls], rhs_dims[rs]
        no_pad = wd.pad_low == 0 and wd.pad_high == 0
        if _spatial_is_batch(lhs_size, rhs_size, wd):
            batch.append(DimRole(ls, rs, os))
            continue
        undilated = wd.lhs_dilate == 1 and wd.rhs_dilate == 1
        whole_window = lhs_size == wd.size == rhs_size and lhs_size > 1 and wd.stride in (1, lhs_size)
        if whole_window and undilated and no_pad and not wd.reversal:
            contracting.append(DimRole(ls, rs, -1))
            continue
        if wd.stride == 1 and wd.lhs_dilate == 1 and wd.rhs_dilate == 1:
            # Trivial spatial dims act as free dims; they keep both operand
            # indices so the other side's size-1 dim is replicated as XLA does.
            if rhs_size == 1 and wd.size == 1 and no_pad and not wd.reversal:
                lhs_nc.append(DimRole(ls, rs, os))
                continue
            if lhs_size == 1 and wd.size == rhs_size and wd.pad_low == wd.pad_high == rhs_size - 1 and wd.reversal:
                rhs_nc.append(DimRole(ls, rs, os))
                continue
        spatial.append(DimRole(ls, rs, os))
    return DotDims(tuple(batch), tuple(contracting), tuple(lhs_nc), tuple(rhs_nc), tuple(spatial))


def _spatial_is_batch(lhs_size: int, rhs_size: int, wd: WindowDim) -> bool:
    """A window that steps over the input one element per output: a batch dim in disguise.

    XLA's SpatialIsBatch: window size = input size = base dilation, and the
    stride or window dilation is max(1, size - 1), with no padding or reversal.
    """
    size = wd.size
    if wd.reversal or wd.pad_low or wd.pad_high:
        return False
    if not (lhs_size == size == wd.lhs_dilate and size > 1):
        return False
    step = max(1, size - 1)
    return wd.stride == step or wd.rhs_dilate == step
