"""`spmd-planner serve [--host 127.0.0.1] [--port 8000] [--db PATH]`: the HTTP service and dashboard."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import socket
from typing import Any


def port_arg(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {text!r}")
    return port


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the planner service (POST /plan, stored plans, HBM dashboard)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=port_arg, default=8000, help="0 picks a free one (default: 8000)")
    p.add_argument("--db", help="stored plans: a SQLite file, or a database URL (postgresql://user@host/db) "
                   "replicas share (default: a SQLite file under the user's data dir)")  # fmt: skip
    p.set_defaults(run=run)


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything says it serves: a port another process holds is one
    line (`cannot listen on 127.0.0.1:8000: address already in use ...`), not a banner then a failure."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = (e.strerror or str(e)).lower()
        hint = " (another server? pick --port)" if e.errno == errno.EADDRINUSE else ""
        raise ValueError(f"cannot listen on {_address(host, port)}: {why}{hint}") from None
    sock.set_inheritable(True)
    return sock


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from api import Settings, create_app
    from api.settings import store_location
    from api.store import shown_url

    sock = listening_socket(args.host, args.port)
    if args.db is not None:
        os.environ["SPMD_PLANNER_DB" if "://" in args.db else "SPMD_PLANNER_DB_PATH"] = args.db
    settings = Settings()
    app = create_app(settings)
    shown = shown_url(store_location(settings))
    print(f"spmd-planner: serving on http://{_address(args.host, sock.getsockname()[1])} (plans in {shown})",
          flush=True)  # fmt: skip
    # One line per request from the service's own log (method, path, status, ms, plan id, cached);
    # uvicorn's access log, which says less, stays off with its other info lines.
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.WARNING)
    logging.getLogger("spmd_planner.api").setLevel(logging.INFO)
    # On SIGTERM or Ctrl-C uvicorn finishes the requests in flight, stops the planner processes and the
    # jobs' Ray, then raises the signal again: SIGTERM ends the process by its default action (status 143,
    # as servers stop), Ctrl-C as the KeyboardInterrupt caught here.
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    return 0
