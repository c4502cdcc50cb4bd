"""HLO: the module IR and everything that reads, writes and walks it, one room per job.

- `ir/`: the module IR (instructions, computations, shapes, typed attributes), and facts read off it alone.
- `inference/`: the shapes XLA's parser infers for instructions written without one.
- `text/`: reading and writing text: HLO, StableHLO (through jaxlib) and Shardy's syntax.
- `structure/`: While loops, call inlining and flattening, and which front end wrote a module.

The public entry points are re-exported from `planner`. The text cursor every grammar reads through lives
outside this package (`planner.scanner`), so that `planner.sharding` parses sharding text without depending on
`planner.hlo`, which depends on it.
"""


def clear_caches() -> None:
    """Forgets what reading HLO memoises across calls: parse-time checks of literals, attributes and metadata."""
    from planner.hlo.text import instruction_checks, opcode_attributes

    for cached in (
        instruction_checks.literal_problem,
        opcode_attributes._names_problem,
        opcode_attributes.metadata_problem,
        opcode_attributes.shape_attribute_problem,
        opcode_attributes.window_problem,
    ):
        cached.cache_clear()
    opcode_attributes._BY_TEXT.clear()
