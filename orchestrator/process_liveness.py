"""Whether a pid written down earlier (a night's lock, a lease, a partial file's name) is still that process."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from orchestrator.proc_stat import stat_fields


def pid_alive(pid: int, recorded_at: datetime | None = None) -> bool:
    """True if a process with this pid runs on this host (a zombie counts as dead). With `recorded_at`
    (when the pid was written down, by the process itself), a process that began after it is another
    one: after a reboot the pids are handed out again, and a dead night's pid can be a shell's (Linux)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive, unless it began after the record
    try:
        fields = stat_fields(pid)  # bytes: a process's name need not be UTF-8 (it raised UnicodeDecodeError)
    except (OSError, IndexError):
        return True
    if fields[0] == b"Z":
        return False
    began = _process_began(fields)
    if recorded_at is not None and began is not None:
        return began <= recorded_at.timestamp() + PID_RECORD_SLACK_S
    return True


# A process starts before it records its pid; this much later still counts as the same (clocks, a shared store's).
PID_RECORD_SLACK_S = 30.0


def _process_began(fields: list[bytes]) -> float | None:
    """When a process began (seconds since the epoch), from its /proc/<pid>/stat fields after the name."""
    try:
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return None
