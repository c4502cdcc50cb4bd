"""The release check: today's newest jax against the pinned one, on Shardy's lit tests and the CI subset.

    python -m fidelity.release_check refs --out FILE [--cases NAME ...]
    python -m fidelity.release_check report --pinned JSON --baseline-refs FILE --release-refs FILE
                                            [--shardy-src DIR] [--cases-out JSON] --out REPORT.md

`refs` compiles the CI subset's JAX cases with the jax of the Python running it (cached by content,
`fidelity.references`) and lists where each record is; it runs once in the pinned environment and
once in the newest. `report` runs in the newest: it regenerates Shardy's propagation lit cases with
that jaxlib's own passes from a copy of openxla/shardy (`fidelity.shardy_source`), at the newest
commit not later than the jaxlib's upload to the package index, compares them and our engine's
results on them with the pinned cases, compares the two environments' While shapes, and writes a
markdown report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = ("jax", "jaxlib", "libtpu")


def installed_versions() -> dict[str, str]:
    out = {}
    for package in PACKAGES:
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def refs(out: Path, names: list[str]) -> int:
    """Compile (or find cached) the CI subset's JAX cases here; write where each record is."""
    from fidelity.cases import CI_SUBSET
    from fidelity.references import cache_dir, ensure_references, reference_path

    # torch_xla's cases need torch_xla's own pinned jax: they have no newest-jax form.
    cases = [c for c in CI_SUBSET if c.front_end == "jax" and (not names or c.name in names)]
    failed = set(ensure_references(cases, jobs=int(os.environ.get("RELEASE_JOBS", "1"))))
    records = {c.name: None if c.name in failed else str(reference_path(c).with_suffix(".xla.json")) for c in cases}
    ours = {c.name: planned(c) for c in cases if c.name not in failed}
    listing = {"versions": installed_versions(), "cache": str(cache_dir()), "records": records, "ours": ours}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(listing, indent=1) + "\n")
    return 0  # a case that fails to compile is a finding: the report says which


def planned(case: Any) -> list[dict[str, Any]] | str:
    """The planner on the step this release compiled, per compiler: bytes, and whether our per-device
    While shapes equal the compiler's (`fidelity.sweep.predict`); why not, if it could not plan it."""
    from fidelity.sweep import predict

    try:
        rows = predict(case)
    except Exception as error:  # a step the planner cannot read from this release is a finding too
        return f"{type(error).__name__}: {error}"
    return [{"backend": r.backend, "compiler_bytes": r.compiler_bytes, "ours_bytes": r.ours_bytes,
             "while_shapes": r.propagation} for r in rows]  # fmt: skip


def _release_time(versions: dict[str, str], notes: list[str]) -> datetime | None:
    """When the installed jaxlib was published: `JAXLIB_RELEASE_DATE`, else the package index."""
    given = os.environ.get("JAXLIB_RELEASE_DATE")
    if given:
        return datetime.fromisoformat(given)
    from fidelity.pypi_release import upload_time

    try:
        return upload_time("jaxlib", versions["jaxlib"])
    except Exception as error:  # offline: the newest commit of the copy, said so in the report
        notes.append(f"jaxlib's release date unknown ({error}); the copy's newest commit was read")
        return None


def regenerate_cases(shardy_src: Path, versions: dict[str, str], notes: list[str]) -> dict[str, Any]:
    from fidelity.shardy_regen import Shardy, regenerate
    from fidelity.shardy_source import lit_files, open_source

    released = _release_time(versions, notes)
    source = open_source(shardy_src, released)
    if released is not None and source.commit_time is not None:
        days = (released - source.commit_time).days
        notes.append(f"jaxlib {versions['jaxlib']} was uploaded {released.date()}; the lit files are at "
                     f"{source.describe()}, {days} days earlier")  # fmt: skip
        if days > 14:
            notes.append(f"**The Shardy copy is {days} days older than the release**: tests added or changed in "
                         "between are not checked; update SHARDY_SRC for a faithful check")  # fmt: skip
    filecheck = os.environ.get("FILECHECK") or shutil.which("FileCheck") or _llvm_filecheck()
    cases = regenerate(Shardy(filecheck), lit_files(source), progress=lambda s: print(s, file=sys.stderr))
    return {"source": f"{source.describe()}, {TEST_DIRS}", "oracle": f"jaxlib {versions['jaxlib']} (its Shardy passes)",
            **cases}  # fmt: skip


TEST_DIRS = "shardy/dialect/sdy/transforms/propagation/{test,debugging/test}"


def _llvm_filecheck() -> str:
    found = sorted(Path("/usr/lib").glob("llvm-*/bin/FileCheck"))
    if not found:
        raise SystemExit("no FileCheck: install Debian's llvm tools (make test-release does) or set FILECHECK")
    return str(found[-1])


def report(args: argparse.Namespace) -> int:
    from fidelity.release_report import write_report

    versions = installed_versions()
    notes: list[str] = []
    fresh = None
    if args.shardy_src:
        fresh = regenerate_cases(Path(args.shardy_src), versions, notes)
        if args.cases_out:
            Path(args.cases_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.cases_out).write_text(json.dumps(fresh, indent=1) + "\n")
    else:
        notes.append("**Shardy's lit cases were not regenerated**: no SHARDY_SRC (see the README)")
    pinned = json.loads(Path(args.pinned).read_text())
    baseline = json.loads(Path(args.baseline_refs).read_text()) if args.baseline_refs else None
    release = json.loads(Path(args.release_refs).read_text()) if args.release_refs else None
    text = write_report(versions, pinned, fresh, baseline, release, notes)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"release check: {args.out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fidelity.release_check", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("refs", help="compile the CI subset's JAX cases with this jax")
    r.add_argument("--out", required=True)
    r.add_argument("--cases", nargs="*", default=[], help="only these CI cases (default: all JAX ones)")
    p = sub.add_parser("report", help="regenerate the lit cases and write the report")
    p.add_argument("--pinned", required=True, help="the pinned release's shardy_propagation_cases.json")
    p.add_argument("--shardy-src", default=os.environ.get("SHARDY_SRC") or None)
    p.add_argument("--cases-out", help="where to write the regenerated cases")
    p.add_argument("--baseline-refs")
    p.add_argument("--release-refs")
    p.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.command == "refs":
        return refs(Path(args.out), args.cases)
    return report(args)


if __name__ == "__main__":
    raise SystemExit(main())
