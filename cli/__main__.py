"""`python -m cli` is the `spmd-planner` command (as is `python -m planner`)."""

import sys

from cli import main

sys.exit(main())
