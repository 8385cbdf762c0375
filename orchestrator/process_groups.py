"""Signals to a process group overnight started (each command and the embedded server run in one of their own),
so that what the process started goes with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def signal_group(pid: int, signum: int) -> None:
    """`signum` to the process group `pid` leads (gone meanwhile, or macOS's zombies, which may not be signalled: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def kill_group(pid: int) -> None:
    """SIGKILL to a process group overnight started."""
    signal_group(pid, signal.SIGKILL)


def stop_group(process: subprocess.Popen, grace_s: float) -> int | None:
    """Terminate `process`'s group, then kill it if it lingers past `grace_s`; its exit code."""
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            process.wait(timeout=grace_s)
    return process.returncode
