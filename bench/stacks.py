"""The CI subset's JAX steps on two JAX stacks: the compilers' bytes and ours, side by side.

    .venv/bin/python bench/stacks.py rows > pinned.json          # jax 0.7.1, libtpu 0.0.20
    .venv-jax/bin/python bench/stacks.py rows > today.json       # jax 0.12, libtpu 0.0.50
    python bench/stacks.py table pinned.json today.json

`rows` generates the references the installed stack lacks (`fidelity.references`, keyed by the stack's
versions) and prints one JSON row per case and compiler: the compiler's per-device bytes, ours for that
compiler and release, and whether our While shapes equal the compiler's. `table` prints them as a
markdown table, today's stack first and the pinned one beside it.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rows() -> list[dict[str, object]]:
    from fidelity.cases import CI_SUBSET
    from fidelity.references import ensure_references
    from fidelity.sweep import predict

    cases = [c for c in CI_SUBSET if c.front_end == "jax"]
    failed = ensure_references(cases, jobs=2)
    if failed:
        raise SystemExit(f"references failed: {failed}")
    stack = f"jax {version('jax')}, libtpu {version('libtpu')}"
    return [
        {
            "case": c.name,
            "backend": r.backend,
            "stack": stack,
            "compiler_bytes": r.compiler_bytes,
            "ours_bytes": r.ours_bytes,
            "propagation": r.propagation,
        }
        for c in cases
        for r in predict(c)
    ]


def table(today: list[dict[str, object]], pinned: list[dict[str, object]]) -> str:
    def mib(n: object) -> str:
        return f"{int(n) / 2**20:,.1f}"  # type: ignore[call-overload]

    def error(row: dict[str, object]) -> str:
        return f"{(int(row['ours_bytes']) - int(row['compiler_bytes'])) / int(row['compiler_bytes']):+.1%}"  # type: ignore[call-overload]

    old = {(r["case"], r["backend"]): r for r in pinned}
    lines = [
        f"| case | compiler | {today[0]['stack']}: MiB | ours | error | While shapes | "
        f"{pinned[0]['stack']}: MiB | ours | error | While shapes |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for row in today:
        before = old.get((row["case"], row["backend"]))
        cells = [str(row["case"]), str(row["backend"]), mib(row["compiler_bytes"]), mib(row["ours_bytes"]), error(row),
                 str(row["propagation"])]  # fmt: skip
        cells += (
            [mib(before["compiler_bytes"]), mib(before["ours_bytes"]), error(before), str(before["propagation"])]
            if before
            else ["n/a"] * 4
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["rows"]:
        print(json.dumps(rows(), indent=1))
        return 0
    if argv[:1] == ["table"] and len(argv) == 3:
        pinned, today = (json.loads(Path(p).read_text()) for p in argv[1:])
        print(table(today, pinned))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
