"""One llama-server process: its command line, started in a process group of its own, and stopped with all of it
whatever happens: when asked, at interpreter exit, or when overnight dies (Linux: the parent-death signal)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.cpu_threads import default_threads
from orchestrator.errors import ModelUnreachable
from orchestrator.local_model_files import LocalModelFiles
from orchestrator.process_groups import stop_group

STOP_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1


def _command(files: LocalModelFiles, context: int, port: int) -> list[str]:
    return [
        str(files.binary),
        "-m", str(files.gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--jinja",
        "--chat-template-file", str(files.template),
        "-c", str(context),
        "-t", str(default_threads()),
        # One conversation at a time: the whole context is its own.
        "--parallel", "1",
    ]  # fmt: skip


def start_server(files: LocalModelFiles, context: int, log_path: Path, port: int, alias: str) -> subprocess.Popen:
    """llama-server started on `port`, answering to `alias`, its output appended to `log_path` after a line that
    marks this start; ModelUnreachable when it cannot be run at all."""
    _load_prctl()
    with log_path.open("ab") as log_file:
        log_file.write(f"--- overnight: llama-server starting on port {port} at {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n".encode())
        log_file.flush()
        try:
            process = subprocess.Popen(
                [*_command(files, context, port), "--alias", alias],
                stdin=subprocess.DEVNULL,
                env=_server_environment(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:  # removed since the night's check, built for another machine: one line, exit 3
            raise ModelUnreachable(f"llama-server could not be run: {files.binary}: {exc.strerror or exc}") from None
    running_servers.add(process)
    return process


# llama-server reads an API key from these as well as from its options: one kept for a person's own
# llama-server locked ours too (every start waited out STARTUP_TIMEOUT_S, "Invalid API Key").
_KEY_VARIABLES = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE")


def _server_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in _KEY_VARIABLES}


def free_port() -> int:
    """A loopback port free now (another program may yet take it before the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


_prctl: list[Any] = []


def _load_prctl() -> None:
    """Found in the parent: the child, forked from a process with threads, only calls it (no dlopen there)."""
    if _prctl or not sys.platform.startswith("linux"):
        return
    import ctypes

    # The process's own symbols first: also musl's libc (Alpine), which has no libc.so.6.
    for library in (None, "libc.so.6"):
        with contextlib.suppress(Exception):
            _prctl.append(ctypes.CDLL(library, use_errno=True).prctl)
            return


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when overnight dies, even by SIGKILL."""
    if _prctl:
        _prctl[0](_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_server(process: subprocess.Popen) -> int | None:
    """Terminate the server's process group, then kill it if it lingers."""
    running_servers.discard(process)
    return stop_group(process, STOP_GRACE_S)


# Servers still running if the interpreter exits without leaving the with-block.
running_servers: set[subprocess.Popen] = set()


@atexit.register
def _stop_all() -> None:
    for process in list(running_servers):
        with contextlib.suppress(Exception):
            stop_server(process)
