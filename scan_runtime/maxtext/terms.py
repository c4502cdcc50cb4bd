"""A plan in MaxText's terms: the mesh as `ici_*_parallelism` overrides, parameters by their path in MaxText's
params tree, next steps as the overrides a user passes to `train_compile` and `train`, and the command that
confirms one with MaxText's own compile.

MaxText builds its mesh from `mesh_axes` (twelve names) and the `ici_<axis>_parallelism` keys, one per axis,
most of them 1: only the axes that split something are said. Its topology names count chips on v5e and v6e
and TensorCores on v4 and v5p (`v5p-8` is 4 chips). A step's parameters reach the lowered module under JAX's
key paths of MaxText's train state (`state['model']['decoder']['layers']['mlp']['wi_0']['kernel'].value`),
which MaxText itself prints as `decoder/layers/mlp/wi_0/kernel` (its `print_shardings_params`); its optimizer
state is optax's AdamW (`mu`, `nu`) of the same paths.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

# MaxText's mesh axis -> its ICI parallelism key (base.yml: `mesh_axes`, `ici_*_parallelism`).
ICI_KEYS = {
    "diloco": "ici_diloco_parallelism",
    "data": "ici_data_parallelism",
    "stage": "ici_pipeline_parallelism",
    "fsdp": "ici_fsdp_parallelism",
    "fsdp_transpose": "ici_fsdp_transpose_parallelism",
    "context": "ici_context_parallelism",
    "context_usp_ulysses": "ici_context_usp_ulysses_parallelism",
    "context_autoregressive": "ici_context_autoregressive_parallelism",
    "tensor": "ici_tensor_parallelism",
    "tensor_sequence": "ici_tensor_sequence_parallelism",
    "expert": "ici_expert_parallelism",
    "autoregressive": "ici_autoregressive_parallelism",
}
# TensorCores per chip in MaxText's topology names (`v5p-8`: 8 cores, 4 chips); other chips are named by chips.
CORES_PER_CHIP = {"v4": 2, "v5p": 2}
# The most chips one slice of these holds (a v5e or v6e pod); beyond, a step runs on several slices.
SLICE_CHIPS = {"v5e": 256, "v6e": 256}
MAX_LINE = 200
COMPILE_MODULE = "maxtext.trainers.pre_train.train_compile"
_TOPOLOGY = re.compile(r"(v\d+[a-z]*)-(\d+)$")


@dataclass(frozen=True)
class MaxTextStep:
    """What MaxText's config says of the step the plan is of."""

    config: str  # the config file the user named (MaxText's base.yml when they named none)
    overrides: tuple[str, ...]  # the user's `key=value` overrides, in their order
    model_name: str
    topology: str  # compile_topology: `v6e-8`
    num_slices: int
    per_device_batch_size: float
    gradient_accumulation_steps: int
    remat_policy: str
    max_target_length: int

    @property
    def chip(self) -> str:
        return topology_chip(self.topology)

    @property
    def chips(self) -> int:
        return topology_chips(self.topology) * self.num_slices


def topology_chip(topology: str) -> str:
    """`v6e-8` -> `v6e`; `v5litepod-16` is MaxText's older name for `v5e-16`."""
    match = _TOPOLOGY.match(topology.replace("v5litepod", "v5e"))
    if match is None:
        raise ValueError(f"compile_topology={topology}: not a TPU topology name like v6e-8 or v5p-16")
    return match.group(1)


def topology_chips(topology: str) -> int:
    """Chips in one slice of `topology`: `v6e-8` 8, `v5p-16` 8 (MaxText counts v5p's TensorCores)."""
    chip = topology_chip(topology)
    count = int(topology.rsplit("-", 1)[1])
    return count // CORES_PER_CHIP.get(chip, 1)


def topology_of(chip: str, chips: int) -> tuple[str, int]:
    """(compile_topology, compile_topology_num_slices) for `chips` chips of `chip`."""
    per_slice = min(chips, SLICE_CHIPS.get(chip, chips))
    return f"{chip}-{per_slice * CORES_PER_CHIP.get(chip, 1)}", chips // per_slice


def mesh_axes(mesh: str | None) -> dict[str, int]:
    """`fsdp=8,tensor=2,...` (the plan's mesh) as {axis: size}."""
    if not mesh:
        return {}
    return {name: int(size) for name, size in (part.split("=") for part in mesh.split(","))}


def mesh_overrides(axes: dict[str, int]) -> list[str]:
    """The axes that split something, as MaxText's keys: `ici_fsdp_parallelism=8`; axes of size 1 are not said."""
    return [f"{ICI_KEYS.get(name, name)}={size}" for name, size in axes.items() if size > 1]


def parameter_name(name: str) -> str:
    """A JAX key path of MaxText's train state as MaxText prints it:
    `state['model']['decoder']['layers']['mlp']['wi_0']['kernel'].value` -> `decoder/layers/mlp/wi_0/kernel`;
    `state['optimizer']['opt_state'][0]['mu']['decoder']...` -> `Adam mu of decoder/...`; the gradient of one
    (`gradient of state[...]`) likewise. Any other name is kept."""
    prefix = ""
    if name.startswith("gradient of "):
        prefix, name = "gradient of ", name.removeprefix("gradient of ")
    keys = re.findall(r"\[(?:'([^']*)'|(\d+))\]", name)
    path = [k or i for k, i in keys]
    if not path or not name.startswith("state"):
        return prefix + name
    if path[0] == "model" or path[0] == "params":
        rest = path[1:]
        if rest[:1] == ["params"]:
            rest = rest[1:]
        return prefix + "/".join(rest)
    if path[0] == "optimizer" or path[0] == "opt_state":
        moments = [k for k in path if k in ("mu", "nu")]
        if moments:
            tail = path[path.index(moments[0]) + 1 :]
            return f"{prefix}Adam {moments[0]} of {'/'.join(tail)}"
        return prefix + "optimizer " + "/".join(path[1:])
    return prefix + "/".join(path)


def number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def with_overrides(step: MaxTextStep, extra: Sequence[str]) -> list[str]:
    """The user's arguments with `extra` in place of their same keys: what `train_compile` is to be given."""
    keys = {e.split("=", 1)[0] for e in extra}
    return [step.config, *(o for o in step.overrides if o.split("=", 1)[0] not in keys), *extra]


def compile_command(maxtext: MaxTextStep, extra: list[str]) -> list[str]:
    """`python -m maxtext...train_compile CONFIG KEY=VALUE ...` with `extra` replacing the user's same keys,
    as lines of at most MAX_LINE characters joined by `\\`."""
    words = ["python", "-m", COMPILE_MODULE, *with_overrides(maxtext, extra)]
    return _wrap([shlex.quote(w) for w in words], indent="    ")


def fit_line(line: str) -> str:
    """One line of at most MAX_LINE characters: a longer one is cut at a separator and says so."""
    if len(line) <= MAX_LINE:
        return line
    cut = line[: MAX_LINE - 2]
    at = max(cut.rfind("; "), cut.rfind(", "))
    return (cut[:at] if at > MAX_LINE // 2 else cut) + " …"


def _wrap(words: list[str], indent: str) -> list[str]:
    lines: list[str] = []
    current = indent
    for word in words:
        if current.strip() and len(current) + 1 + len(word) + 2 > MAX_LINE:
            lines.append(current + " \\")
            current = indent + "  " + word
        else:
            current = f"{current} {word}" if current.strip() else current + word
    lines.append(current)
    return lines


__all__ = [
    "ICI_KEYS",
    "MAX_LINE",
    "MaxTextStep",
    "compile_command",
    "fit_line",
    "mesh_axes",
    "mesh_overrides",
    "number",
    "parameter_name",
    "topology_chip",
    "topology_chips",
    "topology_of",
    "with_overrides",
]
