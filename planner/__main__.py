"""`python -m planner` is the `spmd-planner` command."""

import sys

from planner.cli import main

sys.exit(main())
