"""One Shardy lit case file as a pytest table: its cases, each run once (`fidelity.shardy_lit`), and a param per
case, a strict xfail where a table of reasons names it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from fidelity.shardy_lit import CaseResult, load_cases, run_case


class LitSuite:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._cases: list[dict] | None = None  # type: ignore[type-arg]
        self._results: dict[str, CaseResult] = {}

    def cases(self) -> list[dict]:  # type: ignore[type-arg]
        if self._cases is None:
            self._cases = load_cases(self.path)
        return self._cases

    def result(self, name: str) -> CaseResult:
        if name not in self._results:
            self._results[name] = run_case(next(c for c in self.cases() if c["name"] == name))
        return self._results[name]

    def results(self) -> list[CaseResult]:
        return [self.result(c["name"]) for c in self.cases()]

    def params(self, *reasons: Mapping[str, str]) -> list[object]:
        """A param per case, id `file/function`; a case some table names is a strict xfail with its reason."""
        params: list[object] = []
        for case in self.cases():
            name = case["name"]
            reason = next((table[name] for table in reasons if name in table), None)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(pytest.param(name, marks=marks, id=name.replace(".mlir::", "/")))
        return params
