"""Shared fixtures: real git repositories, a scripted model server on 127.0.0.1, config files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test User",
    "GIT_AUTHOR_EMAIL": "user@example.com",
    "GIT_COMMITTER_NAME": "Test User",
    "GIT_COMMITTER_EMAIL": "user@example.com",
}


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def sighup_at_its_default() -> None:
    """A subprocess's preexec_fn: SIGHUP at its default, as a process started from a terminal or by a service manager
    has it, whatever this test run inherited. Under `nohup pytest ...` (or a runner that ignores SIGHUP) an
    `overnight` started from here inherited it ignored, rightly went on working (reference.md: ignored under
    nohup), and a test that sends it SIGHUP timed out."""
    import signal

    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(content))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def many_slow_files(repo: Path, count: int, smudge: str) -> Path:
    """`count` files under data/, each checked out through a filter whose smudge runs `smudge` first (a large
    repository on a slow disk, or git-lfs fetching each file), committed; the folder."""
    data = repo / "data"
    data.mkdir()
    for number in range(count):
        (data / f"f{number:04d}.txt").write_text(f"file {number}\n")
    git(repo, "config", "filter.slow.smudge", f"{smudge}; cat")
    (repo / ".gitattributes").write_text("data/** filter=slow\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"{count} files checked out slowly")
    return data


def smudges_running(pids: Path) -> list[str]:
    """Those of the filter shells that wrote their pid to `pids` (`echo $$ >> pids`) still running: a zombie (its parent git
    killed, and a container's PID 1 that reaps no orphan) has run its last, and a pid since reused is another's."""
    running = []
    for pid in pids.read_text().split():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone
        if str(pids).encode() in command:
            running.append(pid)
    return running


SAMPLE_FILES = {
    "greet.py": "def greet():\n    return 'helo'\n",
    "check_greet.py": "import greet\nassert greet.greet() == 'hello', greet.greet()\nprint('ok')\n",
    ".gitignore": "*.pyc\n__pycache__/\n",
}


@pytest.fixture(autouse=True)
def own_signal_handlers() -> Iterator[None]:
    """A test that runs the CLI in this process leaves its SIGTERM/SIGINT/SIGHUP handlers (cancel the
    night) behind: pytest itself then ignored a CI job's SIGTERM. Put back after each test."""
    import signal

    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def fresh_logging() -> Iterator[None]:
    """Each test starts with structlog's defaults, never a stream a previous test closed."""
    import structlog

    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git repository with one small bug (greet() misspells 'hello')."""
    return make_repo(tmp_path / "repo", SAMPLE_FILES)


@pytest.fixture
def server() -> Iterator[Any]:
    """A scripted OpenAI-compatible server on 127.0.0.1 that real litellm talks to."""
    from orchestrator.fake_server import ScriptedServer

    with ScriptedServer() as running:
        yield running


def write_config(
    path: Path,
    *,
    api_base: str,
    repo: Path,
    tasks: list[dict[str, Any]] | None = None,
    model: dict[str, Any] | None = None,
    night: dict[str, Any] | None = None,
    guards: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    extra: str = "",
) -> Path:
    """An overnight.toml pointing at `api_base`; fast timeouts, no retry backoff."""
    model = {"name": "openai/scripted", "api_base": api_base, "request_timeout_s": 5, "retries": 1, "retry_backoff_s": 0, **(model or {})}
    night = {"max_iterations": 2, "max_turns": 8, **(night or {})}
    tasks = tasks or [{"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"}]
    lines = ["[model]", *_pairs(model), "", "[repo]", f"path = {_toml(str(repo))}", "", "[state]", 'dir = "state"', *_pairs(state or {}), "", "[night]", *_pairs(night)]
    if guards:
        lines += ["", "[guards]", *_pairs(guards)]
    for task in tasks:
        lines += ["", "[[task]]", *_pairs(task)]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def _pairs(values: dict[str, Any]) -> list[str]:
    return [f"{key} = {_toml(value)}" for key, value in values.items()]


def _toml(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


@pytest.fixture
def config_file(tmp_path: Path, repo: Path, server: Any) -> Callable[..., Path]:
    """Write overnight.toml in tmp_path for `repo` and `server`; keyword arguments override sections."""

    def write(**overrides: Any) -> Path:
        return write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, **overrides)

    return write


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    """A live process that is not an overnight run."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


# --- a throwaway PostgreSQL: the run store as machines sharing the work use it --------------


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL cluster of this test session (tests/postgres_cluster.py): its server URL.

    Skipped only when the PostgreSQL binaries are not installed; any other failure fails.
    """
    from tests.postgres_cluster import bin_dir, throwaway_cluster

    binaries = bin_dir()
    if binaries is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl, postgres) are not installed")
    with throwaway_cluster(binaries) as url:
        yield url


@pytest.fixture
def pg_store_url(postgres_url: str) -> Iterator[str]:
    """A new, empty database of its own on the session's PostgreSQL: its SQLAlchemy URL; dropped afterwards."""
    from tests.postgres_cluster import fresh_database

    with fresh_database(postgres_url) as url:
        yield url


# --- a server on a raw socket: exactly the bytes a broken proxy or server sends --------------


# A raw handler gets the client socket and the request's head; what it sends is the whole answer.
Handler = Callable[[socket.socket, bytes], None]


class RawServer:
    """Answers each request on 127.0.0.1 with `handler`, one thread per connection, one request per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests = 0
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.base = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.url = self.base + "/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(client,), daemon=True).start()

    def _answer(self, client: socket.socket) -> None:
        with client:
            head = _read_request(client)
            if head is None:
                return
            if head.startswith(b"GET "):  # a liveness probe: a live server answers one, whatever its handler does
                client.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            self.requests += 1
            try:
                self.handler(client, head)
            except OSError:
                pass  # the client hung up: routine here

    def pause(self, seconds: float) -> None:
        """Sleep in a handler, waking when the test ends."""
        self._stop.wait(seconds)

    def close(self) -> None:
        self._stop.set()
        # Closed alone, the socket lives on in the kernel while a thread is blocked in accept() on it:
        # it went on taking connections, and a later test's night met this test's handler (a 307).
        # shutdown() wakes that accept(), so the port is free when close() returns.
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def _read_request(client: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = client.recv(65536)
        if not piece:
            return None
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        body += client.recv(65536)
    return head


@pytest.fixture
def raw_server():
    servers: list[RawServer] = []

    def start(handler: Handler) -> RawServer:
        servers.append(RawServer(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
