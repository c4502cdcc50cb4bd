"""HLO text: shapes, attributes, the module IR, its parser and printer.

The public entry points are re-exported from `planner`; this package's
`__init__` stays empty of imports so that `planner.sharding` can share the
scanner without an import cycle.
"""
