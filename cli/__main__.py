"""`python -m cli` is the `spmd-planner` command."""

import sys

from cli import main

sys.exit(main())
