"""Where the host's process counters stood when a command began, so that the sweep after it looks only at the
processes made since (a few) rather than at every process on the host."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from orchestrator.proc_stat import stat_fields


@dataclass(frozen=True)
class ProcessClock:
    """Where the host's process counters stood at one moment (a command's start), so that the
    sweep after the command looks only at the processes made since: Linux's /proc; None elsewhere."""

    last_pid: int | None  # the pid given out last
    forks: int | None  # processes and threads made since boot
    ticks: int  # clock ticks since boot, as /proc/PID/stat gives a process's start

    @classmethod
    def now(cls) -> "ProcessClock":
        return cls(_last_pid(), _forks(), _boot_ticks())

    def made_since(self, pids: list[int]) -> list[int]:
        """Of `pids` (all there are), those made since this moment: the window of pids given out
        since (a few, cheap); or, when the pid counter may have gone all the way round meanwhile
        (as many processes and threads made as pids can be given out: a long build), each one
        whose start time is this moment's or later."""
        (newest, alive), forks = _pid_counter(), _forks()
        if None in (self.last_pid, self.forks, newest, forks):
            return [pid for pid in pids if _started_at_or_after(pid, self.ticks)]
        # The counter skips the pids in use, so it moves on by at most the new ones and the live ones.
        if forks - self.forks + alive >= _pid_max() - _RESERVED_PIDS:
            return [pid for pid in pids if _started_at_or_after(pid, self.ticks)]
        if newest >= self.last_pid:
            return [pid for pid in pids if self.last_pid < pid <= newest]
        return [pid for pid in pids if pid > self.last_pid or pid <= newest]  # wrapped around once meanwhile


# Linux gives out pids from 300 again after pid_max (RESERVED_PIDS); a clock tick is 1/CLK_TCK s.
_RESERVED_PIDS = 300
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _last_pid() -> int | None:
    """The pid most recently given out in this pid namespace (Linux's /proc/loadavg); None elsewhere."""
    return _pid_counter()[0]


def _pid_counter() -> tuple[int | None, int]:
    """The pid given out last, and how many processes and threads there are (Linux's /proc/loadavg)."""
    try:
        with open("/proc/loadavg", "rb") as loadavg:
            fields = loadavg.read().split()
        return int(fields[-1]), int(fields[3].split(b"/")[1])
    except (OSError, ValueError, IndexError):
        return None, 0


def _forks() -> int | None:
    """How many processes and threads the host has made since boot (/proc/stat's `processes`)."""
    try:
        with open("/proc/stat", "rb") as counters:
            data = counters.read()
        at = data.index(b"\nprocesses ") + len(b"\nprocesses ")
        return int(data[at : data.index(b"\n", at)])
    except (OSError, ValueError):
        return None


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as setting:
            return int(setting.read())
    except (OSError, ValueError):
        return 32768


def _boot_ticks() -> int:
    try:
        return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLOCK_TICKS)
    except (AttributeError, OSError):
        return 0


def _started_at_or_after(pid: int, ticks: int) -> bool:
    try:
        return int(stat_fields(pid)[19]) >= ticks - 1  # a tick's rounding either way
    except (OSError, IndexError, ValueError):
        return False
