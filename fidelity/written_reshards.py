"""Explicit reshards a lit test writes, read as the sharding constraints Shardy makes them from.

`sdy.reshard %0 <@mesh, [{"a"}, {}]>` fixes a value's sharding where a user asked for one: Shardy's own
export makes every `sdy.sharding_constraint` such a reshard (`sdy-sharding-constraint-to-reshard`), and
jaxlib's converter to HLO refuses the op itself ("unknown mesh", whatever the mesh). A test whose input
already holds reshards is read with each written back as the constraint it stands for: the same
sharding on the same value, which propagation may not change (`sdy-propagation-pipeline` exports it as
a reshard again).
"""

from __future__ import annotations

import re

_RESHARD = re.compile(r"\bsdy\.reshard (?P<input>%[\w#]+) (?P<sharding><.*>) :")


def reshards_as_constraints(module_text: str) -> str:
    return _RESHARD.sub(r"sdy.sharding_constraint \g<input> \g<sharding> :", module_text)
