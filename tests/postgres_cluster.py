"""A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth, no fsync) and fresh databases on it: the run store as
machines sharing the work use it. tests/conftest.py's `postgres_url` and `bench/kill.py --postgres` both start one."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

BINARIES = ("initdb", "pg_ctl", "postgres")


class ClusterError(RuntimeError):
    """initdb or pg_ctl failed; the message holds its output and the server's log."""


def bin_dir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: on PATH, else Debian's /usr/lib/postgresql/<n>/bin."""
    found = shutil.which("pg_ctl")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True)
    for folder in candidates:
        if all((folder / name).is_file() for name in BINARIES):
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def throwaway_cluster(binaries: Path) -> Iterator[str]:
    """A new cluster made with the programs in `binaries`, running while the block runs: its server URL
    (`postgresql+psycopg://postgres@127.0.0.1:PORT`, no database). Stopped and removed afterwards.

    PostgreSQL refuses root, so as root the cluster is made and run as `nobody`.
    """
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="overnight-pg-"))
    if os.geteuid() == 0:
        as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        shutil.chown(root, "nobody", "nogroup")
    data = root / "data"
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}

    def pg(*args: str) -> None:
        result = subprocess.run([*as_user, *args], env=env, cwd=root, capture_output=True, text=True, timeout=60)
        log = root / "server.log"
        if result.returncode:
            raise ClusterError(f"{Path(args[0]).name} failed:\n{result.stdout}{result.stderr}{log.read_text() if log.exists() else ''}")

    stop = [*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
    # However the process ends (SIGKILL, a CI timeout's SIGTERM: no finally runs), the cluster
    # ends with it: a watchdog in its own session waits for this process's end of a pipe to close.
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, repr(stop), str(root)], stdin=subprocess.PIPE, cwd=root, env=env, start_new_session=True
    )
    try:
        pg(str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync", "--encoding=UTF8", "--no-instructions")
        options = f"-h 127.0.0.1 -p {port} -k {root} -F -c full_page_writes=off -c synchronous_commit=off -c max_connections=200"
        pg(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o", options, "-w", "-t", "30", "start")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        assert watchdog.stdin is not None
        watchdog.stdin.close()  # the watchdog stops the cluster (if it started) and removes its folder
        watchdog.wait(timeout=90)


_WATCHDOG = """
import ast, os, shutil, subprocess, sys
sys.stdin.buffer.read()
if os.path.exists(os.path.join(sys.argv[2], "data", "postmaster.pid")):
    subprocess.run(ast.literal_eval(sys.argv[1]), capture_output=True, timeout=60)
shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str = "overnight_test") -> Iterator[str]:
    """A new, empty database on the cluster at `server_url`: its SQLAlchemy URL; dropped afterwards."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin_url = libpq_url(server_url) + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server_url}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def libpq_url(store_url: str) -> str:
    """A store's SQLAlchemy URL as psycopg takes it."""
    return store_url.replace("postgresql+psycopg://", "postgresql://")
