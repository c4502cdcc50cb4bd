"""HLO text: shapes, attributes, the module IR, its parser and printer.

The public entry points are re-exported from `planner`. The text cursor every
grammar reads through lives outside this package (`planner.scanner`), so that
`planner.sharding` parses sharding text without depending on `planner.hlo`,
which depends on it.
"""
