"""The `spmd-planner` command line."""

from planner.cli.main import main

__all__ = ["main"]
