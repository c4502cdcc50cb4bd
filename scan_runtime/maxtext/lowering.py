"""MaxText's train step lowered as its `train_compile` builds it, stopped before XLA:TPU compiles it.

`train_compile.main` reads the config and overrides, builds the topology's mesh with no TPU attached, the
train state's shapes and shardings from MaxText's own sharding rules, and jits `train_step`; its
`Lowered.compile()` is where the minutes go. Here that call is answered by keeping the `Lowered` and stopping:
the step's StableHLO is what XLA:TPU would have compiled. Runs in the user's MaxText environment (the
project's `make maxtext-env` makes one: `maxtext` 0.2.5 over today's jax and libtpu).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scan_runtime.maxtext.terms import MaxTextStep


class _Lowered(Exception):
    """Raised in place of XLA's compile: the step is lowered, nothing more is needed."""


@dataclass(frozen=True)
class LoweredMaxText:
    lowered: Any  # jax.stages.Lowered
    step: MaxTextStep

    @property
    def stablehlo(self) -> str:
        """`lowered.as_text()` with its debug info: Shardy's shardings, JAX's out_shardings, and JAX's names
        (parameters by their path in the train state, each op by the Flax module that made it)."""
        return str(self.lowered.as_text(debug_info=True))

    @property
    def hlo(self) -> str:
        """`lowered.as_text(dialect="hlo")` with its debug info: readable without jaxlib."""
        return str(self.lowered.as_text(dialect="hlo", debug_info=True))


def base_config() -> str:
    """MaxText's own base.yml, the config `train_compile` reads when the user names none."""
    from maxtext import configs

    return str(Path(configs.__file__).parent / "base.yml")


def split_arguments(arguments: Sequence[str]) -> tuple[str, list[str]]:
    """(config file, overrides) from what `train_compile` takes: a config path first, or only `key=value`s."""
    args = list(arguments)
    for k, arg in enumerate(args):
        if "=" not in arg and k > 0:
            raise ValueError(f"argument {k + 1}, {arg!r}: expected key=value (a MaxText override)")
        if "=" in arg and not arg.split("=", 1)[0]:
            raise ValueError(f"argument {k + 1}, {arg!r}: an override needs a key before '='")
    if args and "=" not in args[0]:
        config = args.pop(0)
        if not Path(config).is_file():
            raise ValueError(f"{config}: no such MaxText config file")
        return config, args
    return base_config(), args


@contextlib.contextmanager
def _compile_stopped(seen: dict[str, Any]) -> Iterator[None]:
    """`Lowered.compile` keeps the lowered step and stops; `pyconfig.initialize` keeps the config it makes."""
    from jax import stages
    from maxtext.configs import pyconfig

    compile_lowered, initialize = stages.Lowered.compile, pyconfig.initialize

    def keep_lowered(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen["lowered"] = self
        raise _Lowered

    def keep_config(*args: Any, **kwargs: Any) -> Any:
        seen["config"] = initialize(*args, **kwargs)
        return seen["config"]

    stages.Lowered.compile = keep_lowered  # type: ignore[method-assign]
    pyconfig.initialize = keep_config
    try:
        yield
    finally:
        stages.Lowered.compile = compile_lowered  # type: ignore[method-assign]
        pyconfig.initialize = initialize


def _said(e: Exception) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def lower_train_step(arguments: Sequence[str]) -> LoweredMaxText:
    """Lower MaxText's train step for `compile_topology` as `train_compile` would compile it."""
    config_path, overrides = split_arguments(arguments)
    keys = {o.split("=", 1)[0] for o in overrides}
    if "compile_topology" not in keys:
        raise ValueError("name the TPU topology to plan for, as train_compile takes it: compile_topology=v6e-8")
    # No TPU is needed to lower for one; libtpu describes the topology (train_compile's own settings).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    seen: dict[str, Any] = {}
    # MaxText prints its progress on stdout, where the plan goes: it goes to stderr with its logs.
    with contextlib.redirect_stdout(sys.stderr):
        from maxtext.trainers.pre_train import train_compile

        try:
            with _compile_stopped(seen), contextlib.suppress(_Lowered):
                train_compile.main(["train_compile", config_path, *overrides])
        except Exception as e:
            # MaxText checks a configuration with asserts and raises from deep in its model code: what it says is
            # the user's answer, the traceback is not.
            raise ValueError(f"MaxText's train_compile refuses the configuration: {_said(e)}") from None
    if "lowered" not in seen:
        raise ValueError("MaxText's train_compile returned without lowering a train step")
    config = seen["config"]
    step = MaxTextStep(
        config=config_path,
        overrides=tuple(overrides),
        model_name=str(config.model_name),
        topology=str(config.compile_topology),
        num_slices=int(config.compile_topology_num_slices),
        per_device_batch_size=float(config.per_device_batch_size),
        gradient_accumulation_steps=int(config.gradient_accumulation_steps),
        remat_policy=str(config.remat_policy),
        max_target_length=int(config.max_target_length),
    )
    return LoweredMaxText(seen["lowered"], step)


__all__ = ["LoweredMaxText", "base_config", "lower_train_step", "split_arguments"]
