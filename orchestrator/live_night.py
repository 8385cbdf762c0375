"""A night of this state dir still at work although recovery got its lock, refused (exit 75).

Its `overnight.lock` was deleted under it (by a person, or a cleaner of "stale" lock files), and the
next run locked a new file: recovering would stop that night's commands, roll its work back and free
its leases. Recovery asks before it touches anything, and again before each step that would touch such
a night's work.
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.leases import owner_host_pid, owner_state_id, task_of_lease
from orchestrator.lock import LOCK_NAME, Holder, LockHeld
from orchestrator.process_liveness import pid_alive


def refuse_beside_a_live_night(store: Any, state_dir: Path, state_id: str, host: str, me: int) -> None:
    """LockHeld (exit 75) if a night of this state dir still works on this host although we got its
    lock: `overnight.lock` was deleted under it (by a person, or a cleaner of "stale" lock files),
    and this run locked a new file. Recovering would stop that night's commands, roll its work back
    and free its leases; it notices the lock is gone at its next check and stops by itself.

    Known by a run of this state dir still marked running, or a task lease of it, whose process lives
    on this host, began before the run (or lease) was recorded, and still has the removed lock file
    open (Linux's /proc shows it; elsewhere, or for another user's process, its being alive is all
    there is to go by). Not its pid alone: a dead night's pid may now be another process's (in a
    container restarted under the same host name, within seconds). The run shows a night that has
    not taken a lease yet (it has just begun, or is writing its report); the lease, one whose run
    recovery has already closed by the time it asks again (the run is closed before recovery's last look)."""
    removed_lock = f"{os.path.realpath(state_dir / LOCK_NAME)} (deleted)"

    def live_night(pid: int, recorded: datetime) -> bool:
        return pid_alive(pid, recorded) and _has_open(pid, removed_lock)

    for run in store.running_runs():
        began = store.on_this_hosts_clock(run.started_at)
        if run.state_id == state_id and run.host == host and run.pid != me and live_night(run.pid, began):
            _refuse(state_dir, Holder(pid=run.pid, host=host, since=began), f"run {run.id}")
    now = store.now()
    for lease in store.leases():
        lease_host, pid = owner_host_pid(lease.owner)
        if owner_state_id(lease.owner) != state_id or lease_host != host or pid is None or pid == me or lease.expires_at <= now:
            continue
        taken = store.on_this_hosts_clock(lease.acquired_at)
        if live_night(pid, taken):
            _refuse(state_dir, Holder(pid=pid, host=host, since=taken), f"holding the lease of task {task_of_lease(lease.task)!r}")


def _has_open(pid: int, target: str) -> bool:
    """Whether process `pid` has a file open that the kernel names `target` (its /proc/<pid>/fd links);
    True where that cannot be seen: no /proc, or another user's process."""
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return True
    except OSError:
        return not os.path.isdir("/proc/self/fd")  # no /proc here; else the process has gone
    for entry in entries:
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(f"/proc/{pid}/fd/{entry}") == target:
                return True
    return False


def _refuse(state_dir: Path, night: Holder, seen_by: str) -> None:
    path = state_dir / LOCK_NAME
    raise LockHeld(
        path,
        night,
        message=f"a night of this state dir still runs (pid {night.pid} on {night.host}, {seen_by}) though {path} "
        "was free: its lock file was removed? Left alone; run again once it has ended",
    )
