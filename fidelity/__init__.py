"""Reference fixtures from real front ends: build a training step, let XLA lower and compile it, record what it decided.

`python -m fidelity.generate --out DIR` writes NAME.hlo and NAME.xla.json for the committed fixture cases;
`python -m fidelity.sweep` generates every case of `CASES` into a content-keyed cache and compares.
Importing this package imports neither jax nor torch: the runners set XLA's flags first.
"""

from fidelity.cases import CASES, Case, MeshSpec, ModelSize, case_named

__all__ = ["CASES", "Case", "MeshSpec", "ModelSize", "case_named"]
