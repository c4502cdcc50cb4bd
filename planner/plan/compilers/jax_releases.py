"""Which jax release wrote a module, told from forms in its text that older jaxlibs' HLO parsers refuse.

HLO text names no release: no header or attribute carries one. What tells them apart is how each
release's XLA prints a few constructs. Each `Form` below was found by lowering the same steps with
jax 0.7.1 and jax 0.12 (`fidelity.sorted_step`, `fidelity.syntax_fixtures`) and handing jax 0.12's text
to jaxlib 0.7.1, whose parser refuses it. A worked example, a sort's comparator:

    jax 0.7.1:  ROOT lt_to.117 = pred[] compare(select_n.112, select_n.116), direction=LT, type=TOTALORDER
    jax 0.12:   ROOT lt_to.1 = pred[] compare(select_n.5, select_n.7), direction=LT, order=TOTAL

and jaxlib 0.7.1 answers `unexpected attribute "order"`. A new form a later release writes is one entry
in `FORMS`.

When the installed jaxlib refuses a module (`planner.errors.JaxlibRefusedText`, reported by the compile's
child), `unreadable_module` turns the refusal into one line: the release that wrote the module, the
installed jaxlib, and what to install to verify it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.errors import UnreadableModule


@dataclass(frozen=True)
class Release:
    """A jax release, as the line names it and as pip installs it (jax 0.12 needs Python 3.12)."""

    name: str
    version: tuple[int, ...]
    python: str

    @property
    def install(self) -> str:
        pin = ".".join(map(str, self.version))
        return f"pip install 'spmd-planner[jax]' 'jax=={pin}.*'"


JAX_0_12 = Release("jax 0.12", (0, 12), "3.12")


@dataclass(frozen=True)
class Form:
    """A construct as `release` writes it, which jaxlibs before that release do not read."""

    pattern: re.Pattern[str]
    shown: str
    release: Release


FORMS = (
    # A comparator's total order (a sort's): jax 0.7.1 writes `type=TOTALORDER`.
    Form(re.compile(r"\border=TOTAL\b"), "`order=TOTAL`", JAX_0_12),
    # A topk's tie order (`lax.top_k`): jax 0.7.1's topk has no such attribute.
    Form(re.compile(r"\btopk\(.*\bis_stable="), "`is_stable` on a topk", JAX_0_12),
    # A collective's groups over a mesh's axes (inside a shard_map): jax 0.7.1 writes the device groups.
    Form(re.compile(r"\breplica_groups=mesh\["), "`replica_groups=mesh[...]`", JAX_0_12),
)

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")


@dataclass(frozen=True)
class Sighting:
    """Where a form is in a module's text: the instruction that carries it."""

    form: Form
    instruction: str


def sighting_in_line(line: str) -> Sighting | None:
    """The form `line` carries, with its instruction's name; None for a line in no form of `FORMS`."""
    named = _INSTRUCTION.match(line)
    for form in FORMS:
        if form.pattern.search(line):
            return Sighting(form, named.group(1) if named else "the module's header")
    return None


def newest_sighting(text: str) -> Sighting | None:
    """The first form of the newest release whose forms the module's text has; None when it has none."""
    seen = [s for line in text.splitlines() if (s := sighting_in_line(line)) is not None]
    return max(seen, key=lambda s: s.form.release.version, default=None)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def unreadable_module(text: str, reason: str, line_text: str, jaxlib: str) -> UnreadableModule:
    """The installed jaxlib (`jaxlib`, its version) refused `text` with XLA's `reason` on `line_text`: which
    release wrote the module and what to install, in one line. A form found on the refused line names the
    release first; else one anywhere in the text does; a release the installed jaxlib already reads does not
    explain the refusal, so then the line gives XLA's reason."""
    installed = f"jaxlib {jaxlib}"
    sighting = sighting_in_line(line_text) or newest_sighting(text)
    if sighting is not None and _version(jaxlib) < sighting.form.release.version:
        release = sighting.form.release
        return UnreadableModule(
            f"the module was written by {release.name} ({sighting.form.shown} on {sighting.instruction}), which "
            f"the installed {installed} cannot read; to verify it, plan it in a Python {release.python} "
            f"environment with {release.name}: {release.install}",
            release.name,
            installed,
            release.install,
        )
    named = _INSTRUCTION.match(line_text)
    where = f" at {named.group(1)}" if named else ""
    return UnreadableModule(
        f"the installed {installed} cannot read the module (XLA's parser{where}: {reason}); a newer jax may have "
        "written it: verify it where the jax that lowered it is installed (pip install 'spmd-planner[jax]' "
        "'jax==<that release>')",
        None,
        installed,
        None,
    )
