"""HLO text for the XLA in the `xla` extra (jaxlib 0.7.1).

Newer XLA prints source locations as debug-info tables (`FileNames`,
`FunctionNames`, `FileLocations`, `StackFrames`) referenced by
`stack_frame_id=N` in metadata; jaxlib 0.7.1 rejects both. They carry no
semantics, so they are dropped before such text goes to that XLA.
"""

from __future__ import annotations

import re

_DEBUG_TABLES = re.compile(r"^(?:FileNames|FunctionNames|FileLocations|StackFrames)\n(?:\d+ [^\n]*\n)*", re.M)
_STACK_FRAME_ID = re.compile(r" stack_frame_id=\d+")


def for_jaxlib_0_7(text: str) -> str:
    return _STACK_FRAME_ID.sub("", _DEBUG_TABLES.sub("", text))
