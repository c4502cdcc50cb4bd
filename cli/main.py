"""`spmd-planner`: one subcommand per job; each is a thin shell over `planner`.

Exit codes: 0 success, 2 bad input (unreadable file, HLO that does not parse, a
mesh or manifest that does not fit the module) or a plan that cannot be made,
with the located message on stderr; 3 a plan printed whole whose `--verify`
compiled nothing (a module the installed jaxlib cannot read, no compiler
installed, XLA failing), the plan's `not verified:` line saying why.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cli import (
    maxtext_command,
    memory_command,
    parse_command,
    plan_command,
    propagate_command,
    search_command,
    serve_command,
)
from planner.errors import TOO_DEEP, PlannerError

_COMMANDS = (
    parse_command,
    propagate_command,
    memory_command,
    plan_command,
    maxtext_command,
    serve_command,
    search_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spmd-planner",
        description="Find buffers GSPMD leaves under-sharded, size HBM per chip, and plan sharding fixes.",
        epilog="exit status: 0 success; 2 bad input, or no plan could be made (the message on stderr); 3 `plan "
        "--verify` printed the plan but compiled nothing (its `not verified:` line says why)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.register(sub)
    return parser


# Options whose value may be typed with a minus sign: argparse takes `--hbm -32GiB` for two options and
# answers "expected one argument"; joined as `--hbm=-32GiB`, the value reaches its check and its message.
_VALUE_OPTIONS = ("--hbm", "--min-bytes", "--threshold")


def _values_kept_with_options(argv: Sequence[str]) -> list[str]:
    joined: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        following = argv[i + 1] if i + 1 < len(argv) else ""
        if arg in _VALUE_OPTIONS and following[:1] == "-" and (following[1:2].isdigit() or following[1:2] == "."):
            joined.append(f"{arg}={following}")
            skip = True
        else:
            joined.append(arg)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_values_kept_with_options(sys.argv[1:] if argv is None else argv))
    try:
        code = int(args.run(args))
        # Short output sits in stdout's buffer until exit, where a reader that already left (`| head -n 0`)
        # would make the interpreter's own flush fail with exit status 120; flushing here catches it below.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader stopped early (`| head`): what it read is what it wanted. Point stdout at
        # devnull so the interpreter's final flush does not fail again, and exit quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (PlannerError, ValueError) as e:
        print(f"spmd-planner: {e}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"spmd-planner: {TOO_DEEP}", file=sys.stderr)
        return 2
    except OSError as e:
        # Commands report their own writes (`cannot write ...`): a file named here is an input. An error
        # without a file name is printed as it is, never as `cannot read None`.
        message = f"cannot read {e.filename}: {e.strerror}" if e.filename is not None else e.strerror or str(e)
        print(f"spmd-planner: {message}", file=sys.stderr)
        return 2
