"""The grid's JAX steps as `lowered.as_text()` prints them by default: StableHLO text.

Each case is lowered exactly as its reference runner lowers it (`run_jax`'s mesh and jit options, the
case's partitioner) and written as NAME.stablehlo.mlir; nothing is compiled, so a case takes seconds.
The directory is keyed by the reference's own content key and this file, so a form is always the
lowering of the module its NAME.hlo holds.

    python -m fidelity.stablehlo_forms NAME [NAME ...]   (XLA_FLAGS sets the device count)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from fidelity.cases import Case, case_named
from fidelity.record import runner_environment
from fidelity.references import PROJECT_ROOT, cache_dir, content_key

SUFFIX = ".stablehlo.mlir"


def stablehlo_path(case: Case) -> Path:
    digest = hashlib.sha256(content_key(case).encode())
    digest.update((PROJECT_ROOT / "fidelity" / "stablehlo_forms.py").read_bytes())
    return cache_dir() / f"stablehlo-{digest.hexdigest()[:16]}" / f"{case.name}{SUFFIX}"


def ensure_stablehlo_forms(cases: list[Case]) -> None:
    """Lower every JAX case whose StableHLO form is not cached yet, one process per device count."""
    missing = [c for c in cases if not stablehlo_path(c).exists()]
    for devices in sorted({c.mesh.num_devices for c in missing}):
        group = [c for c in missing if c.mesh.num_devices == devices]
        env = runner_environment(os.environ)
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        done = subprocess.run([sys.executable, "-m", "fidelity.stablehlo_forms", *(c.name for c in group)], env=env,
                              cwd=PROJECT_ROOT, capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"lowering the StableHLO forms failed:\n{done.stderr[-4000:]}")


def _lower(case: Case) -> str:
    import jax

    from fidelity.run_jax import _lower, _mesh

    jax.config.update("jax_use_shardy_partitioner", case.partitioner == "shardy")
    lowered, _ = _lower(case, _mesh(case, jax.devices()))
    return str(lowered.as_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+")
    args = ap.parse_args(argv)
    for name in args.names:
        case = case_named(name)
        if case.front_end != "jax":
            raise ValueError(f"{name} is a {case.front_end} case: only JAX lowers to StableHLO text")
        path = stablehlo_path(case)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(_lower(case))
        partial.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
