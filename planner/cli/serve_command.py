"""`spmd-planner serve [--host 127.0.0.1] [--port 8000] [--db PATH]`: the HTTP service and dashboard."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the planner service (POST /plan, stored plans, HBM dashboard)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--db", help="stored plans: a SQLite file, or a database URL (postgresql://user@host/db) "
                   "replicas share (default: a SQLite file under the user's data dir)")  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from api import Settings, create_app
    from api.settings import store_location
    from api.store import shown_url

    if args.db is not None:
        os.environ["SPMD_PLANNER_DB" if "://" in args.db else "SPMD_PLANNER_DB_PATH"] = args.db
    settings = Settings()
    shown = shown_url(store_location(settings))
    print(f"spmd-planner: serving on http://{args.host}:{args.port} (plans in {shown})", flush=True)
    # One line per request from the service's own log (method, path, status, ms, plan id, cached);
    # uvicorn's access log, which says less, stays off with its other info lines.
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.WARNING)
    logging.getLogger("spmd_planner.api").setLevel(logging.INFO)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning")
    return 0
