"""Reference fixtures on disk, keyed by content: a case is compiled again only when what makes it changes.

The key of a case hashes its config, the sources that build and record it (models and steps, runners,
the dump readers, the example layer torch_xla runs), the runner's arguments and the versions of the
front ends and compilers (jax, jaxlib, libtpu, torch, torch_xla). The runners start from an
environment without the variables that steer them (`record.runner_environment`). A cached
NAME.hlo / NAME.xla.json (with NAME.tpu_pre_propagation.hlo for a TPU case) under `cache_dir()/KEY/` is
therefore exactly what the runner would write today.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fidelity import torch_xla_tpu
from fidelity.cases import Case
from fidelity.generate import PROJECT_ROOT, run_case
from planner.errors import PlannerError
from planner.user_dirs import user_cache_dir

# What a fixture is made from, besides its case's config: every module the runners import.
_SOURCES = ("fidelity/models.py", "fidelity/steps.py", "fidelity/torch_models.py", "fidelity/run_jax.py",
            "fidelity/run_torch_xla.py", "fidelity/record.py", "fidelity/dumps.py", "fidelity/hlo_text.py",
            "fidelity/memory_stats.py", "examples/llama_layers.py")  # fmt: skip
_COMPILERS = ("jax", "jaxlib", "libtpu", "torch", "torch_xla")
# A transformers model's step is also made from its runner, the drop-in scan it trains through, and the
# package's version.
_TRANSFORMERS_SOURCES = ("fidelity/run_transformers.py", "fidelity/transformers_models.py",
                         "scan_runtime/decoder_layers.py", "scan_runtime/scan.py")  # fmt: skip
# The cache keeps XLA:TPU's module entering propagation beside each TPU case's fixture.
CACHE_RUNNER_ARGS = ("--tpu-pre-propagation",)


def cache_dir() -> Path:
    """`FIDELITY_CACHE`, else the user's cache (`~/.cache/spmd-planner/fidelity`): outside the work tree, so
    that a fresh clone of the project on the same machine (CI's) finds what an earlier one compiled. The
    content key keeps it right across checkouts: a key names exactly what its files were made from."""
    if "FIDELITY_CACHE" in os.environ:
        return Path(os.environ["FIDELITY_CACHE"])
    return user_cache_dir("fidelity")


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def content_key(case: Case) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({"name": case.name, "config": case.config()}, sort_keys=True).encode())
    extra: tuple[str, ...] = torch_xla_tpu.SOURCES if case.front_end == "torch_xla" and case.chip is not None else ()
    if case.transformers_model is not None:
        extra += _TRANSFORMERS_SOURCES
    for source in (*_SOURCES, *extra):
        digest.update((PROJECT_ROOT / source).read_bytes())
    for package in _COMPILERS + (("transformers",) if case.transformers_model is not None else ()):
        digest.update(f"{package}=={_installed(package)}".encode())
    digest.update(" ".join(CACHE_RUNNER_ARGS).encode())
    return digest.hexdigest()[:16]


def reference_path(case: Case) -> Path:
    """Where the case's NAME.hlo lives once generated."""
    return cache_dir() / content_key(case) / f"{case.name}.hlo"


def xla_dump_path(case: Case) -> Path:
    """Where a JAX case's XLA:CPU dump of the module it compiled lives once generated (`run_jax`)."""
    from fidelity.run_jax import XLA_DUMP_SUFFIX

    return reference_path(case).with_name(f"{case.name}{XLA_DUMP_SUFFIX}")


def ensure_references(cases: list[Case], jobs: int = 1) -> list[str]:
    """Generate every case not yet cached; returns the names that failed."""
    missing = [c for c in cases if not reference_path(c).with_suffix(".xla.json").exists()]
    if missing:
        print(f"generating {len(missing)} of {len(cases)} references into {cache_dir()}", file=sys.stderr)

    def one(case: Case) -> str | None:
        if not run_case(case, reference_path(case).parent, None, CACHE_RUNNER_ARGS):
            return case.name
        if case.front_end == "torch_xla" and case.chip is not None:
            try:
                torch_xla_tpu.add_tpu_record(case, reference_path(case))
            except PlannerError as e:
                print(f"FAILED {case.name}: XLA:TPU could not compile the step: {e}", file=sys.stderr)
                reference_path(case).with_suffix(".xla.json").unlink()
                return case.name
        return None

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return [name for name in pool.map(one, missing) if name is not None]
