"""A JAX step with pinned and free outputs, as a trainer writes it, compiled by XLA:CPU and XLA:TPU.

AdamW over a small llama language model that returns its new params and optimizer state pinned to their
shardings (donated) beside the gradients, left free for XLA to shard, and the loss:

    jit(step, donate_argnums=(0, 1), out_shardings=(params', state', None, P()))
        -> (new params, new state, grads, loss)

so XLA compiles it with one propagation flag per output (`{false,...,true,...,false}`). Written in both
forms a user hands over: NAME.hlo (XLA's dump header, flags included), NAME.lowered.hlo (what
`lowered.as_text(dialect="hlo")` prints, no flags) and NAME.stablehlo.mlir (what `lowered.as_text()`
prints); NAME.xla.json holds each compiler's bytes per device
and output shardings. Cached by content like the grid's references.

    python -m fidelity.mixed_outputs --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fidelity.cases import Case, MeshSpec, ModelSize
from fidelity.record import runner_environment
from fidelity.references import PROJECT_ROOT, cache_dir

NAME = "jax_llama_lm_take_V4096_adamw_mixed_outputs_gspmd_fsdp4_tp2_L4_D512"
CASE = Case(NAME, "jax", "gspmd", None, ModelSize(4, 512, 1408, 8, 2, 64, 8, 256, vocab_size=4096),
            MeshSpec((4, 2)), "llama", True, "v6e", step="lm", cross_entropy="take_along_axis",
            optimizer="adamw")  # fmt: skip
_SOURCES = ("fidelity/mixed_outputs.py", "fidelity/steps.py", "fidelity/models.py", "fidelity/memory_stats.py",
            "planner/plan/compilers/xla_compile.py")  # fmt: skip


def reference_dir() -> Path:
    digest = hashlib.sha256()
    for source in _SOURCES:
        digest.update((PROJECT_ROOT / source).read_bytes())
    from fidelity.references import _installed  # the compilers' versions, as the grid's keys take them

    for package in ("jax", "jaxlib", "libtpu"):
        digest.update(f"{package}=={_installed(package)}".encode())
    return cache_dir() / f"mixed-{digest.hexdigest()[:16]}"


def ensure_reference() -> Path:
    """The directory holding NAME.hlo, NAME.lowered.hlo and NAME.xla.json, generated if missing."""
    out = reference_dir()
    if (out / f"{NAME}.xla.json").exists():
        return out
    env = runner_environment(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "fidelity.mixed_outputs", "--out", str(out)], env=env,
                          cwd=PROJECT_ROOT, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the mixed-output step did not compile:\n{done.stderr[-4000:]}")
    return out


def _step(mesh: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from fidelity.steps import _adamw, _lm_loss, abstract_args

    args = abstract_args(CASE, mesh)
    loss_fn = _lm_loss(CASE, mesh)

    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        new_params, new_state = _adamw(CASE, params, grads, opt_state)
        return new_params, new_state, grads, loss

    def shardings(tree: Any) -> Any:
        return jax.tree.map(lambda a: a.sharding, tree)

    replicated = NamedSharding(mesh, PartitionSpec())
    options = {"out_shardings": (shardings(args[0]), shardings(args[1]), None, replicated), "donate_argnums": (0, 1)}
    return step, args, options


def _memory(compiled: Any) -> int:
    stats = compiled.memory_analysis()
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
               - stats.alias_size_in_bytes)  # fmt: skip


def _hlo_shardings(compiled: Any, shapes: Any) -> list[str]:
    import jax

    leaves = jax.tree_util.tree_leaves(compiled.output_shardings)
    return [str(s._to_xla_hlo_sharding(len(a.shape))) for s, a in zip(leaves, jax.tree_util.tree_leaves(shapes))]


def run(out: Path) -> None:
    import jax
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh

    jax.config.update("jax_use_shardy_partitioner", False)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))
    step, args, options = _step(mesh)
    lowered = jax.jit(step, **options).lower(*args)
    text = lowered.as_text(dialect="hlo", debug_info=True)
    compiled = lowered.compile()
    dumps = Path(os.environ["XLA_DUMP_DIR"])
    header = next(
        line
        for f in sorted(dumps.glob("*before_optimizations.txt"))
        for line in f.read_text().splitlines()[:1]
        if line.startswith("HloModule jit_step")
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{NAME}.lowered.hlo").write_text(text)
    (out / f"{NAME}.stablehlo.mlir").write_text(str(lowered.as_text()))
    (out / f"{NAME}.hlo").write_text(header + "\n" + text.partition("\n")[2])
    shapes = jax.eval_shape(step, *args)
    record: dict[str, Any] = {"name": NAME, "cpu": {"total_bytes": _memory(compiled),
                                                     "output_shardings": _hlo_shardings(compiled, shapes)}}  # fmt: skip
    assert CASE.tpu_topology is not None, "the case names a chip"
    topology = topologies.get_topology_desc(platform="tpu", topology_name=CASE.tpu_topology)
    tpu_mesh = Mesh(np.array(topology.devices[:8]).reshape(4, 2), ("fsdp", "tp"))
    step, args, options = _step(tpu_mesh)
    tpu = jax.jit(step, **options).lower(*args).compile()
    from planner.plan.compilers.xla_compile import hbm_allocated_bytes

    # XLA:TPU's HBM per chip: its buffer assignment of the step (XLA:CPU's are named `*cpu_after_optimizations*`).
    dumped = dumps.glob("module_*.jit_step.*after_optimizations-buffer-assignment.txt")
    assignments = [p for p in dumped if "cpu_after" not in p.name]
    if not assignments:
        raise FileNotFoundError(f"XLA:TPU dumped no buffer assignment of jit_step in {dumps}")
    assignment = max(assignments, key=lambda p: p.stat().st_size)
    record["tpu"] = {"topology": CASE.tpu_topology, "total_bytes": _memory(tpu),
                     "hbm_bytes": hbm_allocated_bytes(assignment.read_text()),
                     "output_shardings": _hlo_shardings(tpu, shapes)}  # fmt: skip
    (out / f"{NAME}.xla.json").write_text(json.dumps(record, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if "XLA_DUMP_DIR" not in os.environ:
        # XLA reads its flags once, when jax starts: set them and start again.
        with tempfile.TemporaryDirectory(prefix="mixed-outputs-") as dumps:
            env = dict(os.environ, XLA_DUMP_DIR=dumps, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
                       XLA_FLAGS=f"--xla_force_host_platform_device_count=8 --xla_dump_to={dumps} "
                                 "--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE")  # fmt: skip
            return subprocess.run([sys.executable, "-m", "fidelity.mixed_outputs", *sys.argv[1:]], env=env).returncode
    run(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
