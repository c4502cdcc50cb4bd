"""A real PostgreSQL server for the tests: Debian's `postgresql` package, started in a temporary directory.

`make test` installs the package where it is missing. The server listens on 127.0.0.1 only, trusts
local connections (a throwaway cluster) and is stopped when the tests end. PostgreSQL refuses to
run as root: as root the cluster belongs to the package's `postgres` user.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import psycopg


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        done = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(done.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql; `make test` does it)")
    return versions[-1].parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One throwaway cluster; `new_database()` gives each test a database of its own."""

    def __init__(self, root: Path) -> None:
        self.bindir = _bindir()
        self.data = root / "data"
        self.port = _free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        root.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(root, "postgres")
        self.user = "postgres" if self.as_user else None
        self.log = root / "server.log"

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr[-2000:]}\n{log}")

    def start(self) -> PostgresServer:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-h 127.0.0.1 -p {self.port} -k {self.data} -c fsync=off -c max_connections=200"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")  # fmt: skip
        return self

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
