"""Waiting for a command to end, woken the moment it does, and given up at once when the night is cancelled."""

from __future__ import annotations

import os
import select
import subprocess
import time
from typing import Any

# How often a running command looks at the cancel token.
_CANCEL_POLL_S = 0.1


def wait_for_exit(process: subprocess.Popen[bytes], timeout_s: float, cancel: Any) -> int:
    """process.wait(timeout_s), but giving up at once when `cancel` is set.

    `Popen.wait(timeout)` sleeps and polls, up to 50 ms past the exit; a pidfd
    (Linux 5.3+) wakes the moment the process ends. Elsewhere, the polling wait.
    """
    try:
        exited = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        exited = None
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(process.args, timeout_s)
            slice_s = min(remaining, _CANCEL_POLL_S) if cancel is not None else remaining
            if exited is None:
                try:
                    return process.wait(timeout=slice_s)
                except subprocess.TimeoutExpired:
                    continue
            if select.select([exited], [], [], slice_s)[0]:
                return process.wait()
    finally:
        if exited is not None:
            os.close(exited)
