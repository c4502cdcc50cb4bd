"""The `spmd-planner` command line."""

from cli.main import main

__all__ = ["main"]
