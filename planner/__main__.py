"""`python -m planner` is the `spmd-planner` command: the one module of the package that runs the CLI (the
import contract names this exception)."""

import sys

from cli.main import main

sys.exit(main())
