"""Compile one MaxText train step for a TPU topology ahead of time, as its users do, and record what XLA:TPU decided.

    python -m fidelity.run_maxtext NAME --out DIR [--model llama3-8b] [--topology v6e-8]
                                   [--partitioner shardy|gspmd] [--layers N] [--set KEY=VALUE ...]
                                   [--keep-dumps] [--dump-pass-re REGEX] [--disable-passes A,B]

Runs in the environment `make maxtext-env` makes (`.venv-maxtext`: `maxtext` 0.2.5 on Python 3.12, today's
jax and libtpu), with the project on PYTHONPATH. MaxText's own `train_compile` builds and compiles the
step (its config, sharding rules, remat policy and optimizer), with no TPU attached; this runner only
watches it:

- the step in all three forms a user has: XLA's dump of the compile (`NAME.xla_dump.hlo`, what
  `--xla_dump_to` writes), `lowered.as_text(dialect="hlo")` (`NAME.hlo`) and `lowered.as_text()`
  (StableHLO, `NAME.stablehlo.mlir`), taken from the `Lowered` that `train_compile` compiles;
- `NAME.xla.json`: XLA:TPU's memory statistics of the compiled step, its HBM per chip (`tpu.hbm_bytes`,
  below), the per-device While shapes right after `tpu-spmd-partitioning`, the partitioner, topology and
  MaxText's overrides;
- `NAME.memory-usage-report.txt`: XLA:TPU's own account of its buffer assignment, allocation by allocation.

HBM per chip is what its buffer assignment allocates in the default memory space
(`fidelity.memory_stats`), the report's total for that space.
A step XLA:TPU refuses with its compile-time out-of-memory error quotes exactly that total, whatever
libtpu calls it (Mixtral 8x7B on v5p-8: "HLO temporaries (100.03G)", and a report whose color 0 totals
100.03 GiB, 63 GiB of it f32 parameters and optimizer state). A refusal is recorded as such (`tpu.oom`:
the bytes its message quotes and those available) in place of the memory statistics.

`train_compile` in MaxText 0.2.5 does not apply its `shardy` key; the partitioner is chosen the way JAX
reads it, `JAX_USE_SHARDY_PARTITIONER`, before jax is imported. `--layers` sets
`base_num_decoder_layers` (with `override_model_config=True`): a reduced step compiles in a minute or
two on two cores where the full model takes many.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from fidelity.dumps import DUMP_PASS_RE, largest_module, while_shapes
from fidelity.memory_stats import hbm_oom, memory_record, reference_bytes


def maxtext_argv(model: str, topology: str, layers: int | None, overrides: list[str]) -> list[str]:
    """`train_compile`'s argv for a model on a topology (`v6e-8`: MaxText's own topology names)."""
    from maxtext import configs

    base = Path(configs.__file__).parent / "base.yml"
    argv = ["train_compile", str(base), f"compile_topology={topology}", "compile_topology_num_slices=1",
            f"model_name={model}", "run_name=fidelity", "base_output_directory=/tmp/fidelity-maxtext"]  # fmt: skip
    if layers is not None:
        argv += [f"base_num_decoder_layers={layers}", "override_model_config=True"]
    return argv + overrides


class StepDoesNotFit(Exception):
    """XLA:TPU refused the step: it needs more HBM per chip than the chip has."""


def _capture_lowered(out_dir: Path, name: str, seen: dict[str, Any]) -> None:
    """Wrap `jax.stages.Lowered.compile` to keep the step's text forms and its compiled memory statistics."""
    from jax import stages

    compile_lowered = stages.Lowered.compile

    def compile_and_record(self: Any, *args: Any, **kwargs: Any) -> Any:
        (out_dir / f"{name}.hlo").write_text(self.as_text(dialect="hlo", debug_info=True))
        (out_dir / f"{name}.stablehlo.mlir").write_text(self.as_text())
        start = time.perf_counter()
        try:
            compiled = compile_lowered(self, *args, **kwargs)
        except Exception as e:
            # XLA:TPU's compile-time out-of-memory error is a reference too: what the step needs per chip.
            seen["compile_seconds"] = round(time.perf_counter() - start, 3)
            oom = hbm_oom(str(e))
            if oom is None:
                raise
            seen["oom"] = oom
            raise StepDoesNotFit(oom["message"]) from e
        seen["compile_seconds"] = round(time.perf_counter() - start, 3)
        seen["memory"] = memory_record(compiled.memory_analysis())
        return compiled

    stages.Lowered.compile = compile_and_record  # type: ignore[method-assign]


def run(name: str, out_dir: Path, model: str, topology: str, partitioner: str, layers: int | None,
        overrides: list[str], keep_dumps: bool = False, dump_pass_re: str = DUMP_PASS_RE,
        disabled_passes: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    dump_dir = out_dir / f"{name}.dump"
    shutil.rmtree(dump_dir, ignore_errors=True)
    flags = [f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_as_text", f"--xla_dump_hlo_pass_re={dump_pass_re}"]
    if disabled_passes:
        flags.append(f"--xla_disable_hlo_passes={','.join(disabled_passes)}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    os.environ["JAX_USE_SHARDY_PARTITIONER"] = "true" if partitioner == "shardy" else "false"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    import jaxlib
    from maxtext.trainers.pre_train import train_compile

    seen: dict[str, Any] = {}
    _capture_lowered(out_dir, name, seen)
    argv = maxtext_argv(model, topology, layers, overrides)
    start = time.perf_counter()
    # A refusal is recorded in `seen`: the step's reference is then what XLA:TPU needed.
    with contextlib.suppress(StepDoesNotFit):
        train_compile.main(argv)
    module = largest_module(dump_dir)
    shutil.copy(module.before_optimizations, out_dir / f"{name}.xla_dump.hlo")
    report = _same_module(dump_dir, module.prefix, "*memory-usage-report.txt")
    if report:
        shutil.copy(report[-1], out_dir / f"{name}.memory-usage-report.txt")
    assignment = _same_module(dump_dir, module.prefix, "*after_optimizations-buffer-assignment.txt")
    from planner.plan.compilers.xla_compile import hbm_allocated_bytes

    assignment_text = assignment[-1].read_text() if assignment else None
    hbm = hbm_allocated_bytes(assignment_text) if assignment_text is not None else None
    live_range = _same_module(dump_dir, module.prefix, "*after_optimizations-live-range.txt")
    heap = heap_record(live_range[-1].read_text(), assignment_text) if assignment_text and live_range else None
    partitioned = _same_module(dump_dir, module.prefix, "*after_tpu-spmd-partitioning*.txt")
    if not partitioned:
        raise FileNotFoundError(f"no dump after tpu-spmd-partitioning of {module.prefix} in {dump_dir}")
    from importlib import metadata

    record = {
        "name": name,
        "generator": f"fidelity.run_maxtext (maxtext {metadata.version('maxtext')})",
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "libtpu": metadata.version("libtpu"),
        "model": model,
        "topology": topology,
        "partitioner": partitioner,
        "layers": layers,
        "overrides": overrides,
        **({"disabled_passes": list(disabled_passes)} if disabled_passes else {}),
        # MaxText's own base config, named by its place in the package rather than this machine's path.
        "argv": [argv[0], "maxtext/configs/base.yml", *argv[2:]],
        "compile_seconds": seen.get("compile_seconds"),
        "wall_seconds": round(time.perf_counter() - start, 3),
        "tpu": {
            **({"oom": seen["oom"]} if "oom" in seen else {"memory": seen["memory"]}),
            **({"hbm_bytes": hbm} if hbm is not None else {}),
            **({"heap": heap} if heap is not None else {}),
            "post_partition_while_shapes": while_shapes(partitioned[-1].read_text()),
        },
    }
    (out_dir / f"{name}.xla.json").write_text(json.dumps(record, indent=1) + "\n")
    if not keep_dumps:
        shutil.rmtree(dump_dir, ignore_errors=True)
    return record


def heap_record(live_range: str, buffer_assignment: str) -> dict[str, Any]:
    """How XLA:TPU packed its HBM heap (`fidelity.xla_peak`): the heap's size, the most its buffers hold at
    once by their live ranges, and the sizes of those buffers, what a packing model is fitted on."""
    from fidelity.xla_peak import read_peak, thread_local_allocations

    peak = read_peak(live_range, buffer_assignment)
    return {
        "heap_bytes": peak.heap_bytes,
        "live_peak_bytes": peak.heap_live_peak_bytes,
        "live_peak_buffer_sizes": peak.heap_live_peak_sizes,
        "value_count": peak.heap_value_count,
        "thread_local": thread_local_allocations(buffer_assignment),
    }


def _same_module(dump_dir: Path, prefix: str, pattern: str) -> list[Path]:
    """Dumps of the module `prefix` names, under whichever `module_NNNN` id XLA gave each compile of it:
    a step can be dumped before optimization under one id and compiled under another."""
    name = prefix.split(".", 1)[1]
    return sorted(dump_dir.glob(f"module_*.{name}.{pattern}"), key=lambda p: p.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--topology", default="v6e-8")
    parser.add_argument("--partitioner", choices=("shardy", "gspmd"), default="shardy")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a MaxText config override (repeatable)",
    )
    parser.add_argument(
        "--keep-dumps",
        action="store_true",
        help="keep XLA's pass dumps in OUT/NAME.dump (read its peak with fidelity.xla_peak)",
    )
    parser.add_argument(
        "--dump-pass-re",
        default=DUMP_PASS_RE,
        help="the passes whose boundaries XLA dumps (`.*`: every pass that changed the module; with --keep-dumps)",
    )
    parser.add_argument(
        "--disable-passes",
        default="",
        metavar="A,B",
        help="XLA passes to turn off by name (`--xla_disable_hlo_passes`), to see what each one changes",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    disabled = tuple(p for p in args.disable_passes.split(",") if p)
    record = run(args.name, args.out, args.model, args.topology, args.partitioner, args.layers, args.overrides,
                 args.keep_dumps, args.dump_pass_re, disabled)  # fmt: skip
    whiles = len(record["tpu"]["post_partition_while_shapes"])
    if "oom" in record["tpu"]:
        needs, _ = reference_bytes(record)
        available = record["tpu"]["oom"]["available_bytes"]
        print(f"{args.name}: XLA:TPU refuses it: needs {needs / 2**30:.2f} GiB per chip of {available / 2**30:.2f}, "
              f"{whiles} Whiles, compile {record['compile_seconds']} s")  # fmt: skip
        return 0
    held, _ = reference_bytes(record)
    print(f"{args.name}: XLA:TPU {held / 2**30:.2f} GiB of HBM per chip, {whiles} Whiles, "
          f"compile {record['compile_seconds']} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
