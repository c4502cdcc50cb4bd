"""The release check's report as markdown: versions, Shardy's lit cases, our engine on them, the loops."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from fidelity.release_diff import (
    diff_cases,
    engine_changes,
    engine_results,
    engine_score,
    memory_bytes,
    while_changes,
)

# Changes listed one per line up to this many per kind; the rest counted.
_MAX_LISTED = 25


def write_report(
    versions: dict[str, str],
    pinned: dict[str, Any],
    fresh: dict[str, Any] | None,
    baseline: dict[str, Any] | None,
    release: dict[str, Any] | None,
    notes: list[str],
) -> str:
    lines = ["# Release check", ""]
    lines.append(f"Newest: jax {versions['jax']}, jaxlib {versions['jaxlib']}, libtpu {versions['libtpu']}.")
    if baseline is not None:
        b = baseline["versions"]
        lines.append(f"Pinned: jax {b['jax']}, jaxlib {b['jaxlib']}, libtpu {b['libtpu']}.")
    lines.append(f"Pinned Shardy cases: {pinned.get('source')}, by {pinned.get('oracle')}.")
    lines += [""] + [f"- {n}" for n in notes] + [""]
    if fresh is not None:
        lines += _lit_section(pinned, fresh)
    if baseline is not None and release is not None:
        lines += _loops_section(baseline, release)
    return "\n".join(lines).rstrip() + "\n"


def _lit_section(pinned: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    old, new = pinned["cases"], fresh["cases"]
    old_names = {c["name"] for c in old}
    lines = ["## Shardy's propagation lit tests", ""]
    lines.append(f"Regenerated from {fresh['source']} by {fresh['oracle']}.")
    checks = Counter[str]()
    for f in fresh["files"]:
        checks.update(f["filecheck"])
    errors = [f"{Path(f['source']).name} {e}" for f in fresh["files"] for e in f["errors"]]
    lines += [
        "",
        f"- {len(fresh['files'])} files, {len(new)} cases ({sum(1 for c in new if c['kind'] == 'rule')} rule cases); "
        f"{len(old)} in the pinned set, {len(new) - len(old_names & {c['name'] for c in new})} outside it "
        "(held back there, or new): their values are counted below, never listed",
        f"- FileCheck against the tests' CHECK lines, per chunk: {checks['pass']} pass, {checks['fail']} fail, "
        f"{checks['skipped']} skipped (no CHECK lines, or the passes failed)",
        f"- chunks whose passes fail: {len(errors)}" + (f" ({'; '.join(errors)})" if errors else ""),
        "",
    ]
    lines += _filecheck_table(pinned["files"], fresh["files"])
    diff = diff_cases(old, new)
    titles = {
        "removed": "Pinned cases the regenerated set lacks",
        "unreadable": "Cases that no longer read (the passes or the converter to HLO refuse them)",
        "readable again": "Cases that read again",
        "filecheck": "FileCheck verdicts that changed",
        "values": "Expected shardings that changed",
        "rules": "Sharding rules that changed",
        "hlo": "HloShardings that changed (after jaxlib's conversion)",
    }
    lines.append(f"Against the pinned set ({diff.num_common} cases in both):")
    lines.append("")
    for what, title in titles.items():
        found = diff.of(what)
        lines.append(f"- {title}: {len(found)}")
        lines += [f"  - `{c.name}`{': ' + c.detail if c.detail else ''}" for c in found[:_MAX_LISTED]]
        if len(found) > _MAX_LISTED:
            lines.append(f"  - ... and {len(found) - _MAX_LISTED} more")
    lines += ["", *_engine_lines(old, new, old_names), ""]
    return lines


def _filecheck_table(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """FileCheck's verdicts per file, pinned and regenerated (held-back chunks included, so counted only)."""
    before = {f["source"]: f["filecheck"] for f in old}
    lines = ["| file | FileCheck pinned (pass/fail/skipped) | regenerated |", "|---|---|---|"]
    for f in new:
        a, b = before.get(f["source"]), f["filecheck"]
        if a == b:
            continue
        was = "/".join(str(a[k]) for k in ("pass", "fail", "skipped")) if a else "(not pinned)"
        now = "/".join(str(b[k]) for k in ("pass", "fail", "skipped"))
        lines.append(f"| {Path(f['source']).name} | {was} | {now} |")
    complaints = [f"- {Path(f['source']).name}:{c}" for f in new for c in f.get("filecheck_failures", [])]
    found = ["FileCheck's first complaint in each chunk that fails:", "", *complaints, ""] if complaints else []
    if len(lines) == 2:
        return ["FileCheck's verdicts per file are the pinned ones.", "", *found]
    return ["Files whose FileCheck verdicts changed:", "", *lines, "", *found]


def _engine_lines(old: list[dict[str, Any]], new: list[dict[str, Any]], old_names: set[str]) -> list[str]:
    before, after = engine_results(old), engine_results(new)
    rows = [
        ("pinned cases, pinned expectations", engine_score(before)),
        ("pinned cases, regenerated expectations", engine_score(after, old_names)),
        ("cases outside the pinned set", engine_score(after, set(after) - old_names)),
        ("every regenerated case", engine_score(after)),
    ]
    lines = ["Our Shardy engine (`fidelity.shardy_lit`), values equal to jaxlib's:", ""]
    lines += ["| cases | values matched | cases | failed to run |", "|---|---|---|---|"]
    for label, s in rows:
        lines.append(f"| {label} | {s.matched} of {s.expected} ({s.percent:.1f}%) | {s.num_cases} | {len(s.errors)} |")
    changed = engine_changes(before, {n: r for n, r in after.items() if n in old_names})
    lines += ["", f"Values of pinned cases whose agreement changed: {len(changed)}"]
    lines += [f"- `{name}` {key}: {what}" for name, key, what in changed[:_MAX_LISTED]]
    return lines


def _loops_section(baseline: dict[str, Any], release: dict[str, Any]) -> list[str]:
    b, r = baseline["versions"], release["versions"]
    lines = ["## The CI subset's JAX steps, compiled", ""]
    lines.append(f"jax {b['jax']} / libtpu {b['libtpu']} against jax {r['jax']} / libtpu {r['libtpu']} "
                 "(XLA:CPU on 8 virtual devices, XLA:TPU ahead of time).")  # fmt: skip
    lines += [
        "",
        "| case | compiled (pinned / newest) | While shapes | XLA:CPU MiB | XLA:TPU MiB |",
        "|---|---|---|---|---|",
    ]
    details: list[str] = []
    for name in sorted(baseline["records"].keys() | release["records"].keys()):
        old_path, new_path = baseline["records"].get(name), release["records"].get(name)
        compiled = f"{'yes' if old_path else 'no'} / {'yes' if new_path else 'no'}"
        if not (old_path and new_path):
            lines.append(f"| `{name}` | {compiled} | - | - | - |")
            continue
        old, new = json.loads(Path(old_path).read_text()), json.loads(Path(new_path).read_text())
        changes = while_changes(old, new)
        (c0, t0), (c1, t1) = memory_bytes(old), memory_bytes(new)
        lines.append(f"| `{name}` | {compiled} | {_loops_summary(changes)} | "
                     f"{_mib(c0)} -> {_mib(c1)} | {_mib(t0)} -> {_mib(t1)} |")  # fmt: skip
        details += [f"- `{name}`: {c}" for c in changes]
    if details:
        lines += ["", "XLA's While shapes that differ between the releases:", "", *details]
    return lines + ["", *_ours_lines(baseline, release)]


def _loops_summary(changes: list[str]) -> str:
    """`same`, or how many loops (per compiler and stage) carry other elements and how many only moved them."""
    if not changes:
        return "same"
    moved = sum(1 for c in changes if c.endswith("reordered"))
    parts = [f"{len(changes) - moved} differ" if len(changes) > moved else "", f"{moved} reordered" if moved else ""]
    return ", ".join(p for p in parts if p)


def _ours_lines(baseline: dict[str, Any], release: dict[str, Any]) -> list[str]:
    """The planner on each release's compile: its bytes and While shapes against that compiler's."""
    lines = [
        "The planner on each release's step, against that release's compiler (While shapes: ours against "
        "the compiler's per-device ones):",
        "",
        "| case | compiler | pinned: MiB, ours, While shapes | newest: MiB, ours, While shapes |",
        "|---|---|---|---|",
    ]
    old_rows, new_rows = baseline.get("ours", {}), release.get("ours", {})
    for name in sorted(old_rows.keys() | new_rows.keys()):
        old, new = _by_backend(old_rows.get(name)), _by_backend(new_rows.get(name))
        for backend in sorted(old.keys() | new.keys()):
            lines.append(f"| `{name}` | {backend} | {old.get(backend, '-')} | {new.get(backend, '-')} |")
    return lines + [""]


def _by_backend(rows: list[dict[str, Any]] | str | None) -> dict[str, str]:
    if rows is None:
        return {}
    if isinstance(rows, str):
        return {"(not planned)": rows[:120]}
    out = {}
    for r in rows:
        error = (r["ours_bytes"] - r["compiler_bytes"]) / r["compiler_bytes"] if r["compiler_bytes"] else 0.0
        out[r["backend"]] = f"{_mib(r['compiler_bytes'])}, {_mib(r['ours_bytes'])} ({error:+.1%}), {r['while_shapes']}"
    return out


def _mib(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:,.1f}"
