"""The processes a command left behind, found and killed: also those that left its process group (`setsid`, a
daemon), which a group kill misses. Run after each command, and by recovery for a night that was killed."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Iterator

from orchestrator.command_environment import COMMAND_MARK
from orchestrator.proc_stat import stat_fields
from orchestrator.process_clock import ProcessClock


def stop_marked_processes(folder: Path, *, below: bool = False, created_after: ProcessClock | None = None) -> dict[int, str]:
    """Kill the process group of every process a command run in `folder` left (with `below`, a
    command run in any folder under it); returns {group: that command's folder}.

    Such a process is known by COMMAND_MARK in its environment, inherited by all a command
    starts, also by what left its process group (`setsid`, a daemon), which the group kill
    misses; or, in the sweep after a command (`created_after`), if it overwrote its environment
    to set its title (redis, postgres, anything using setproctitle: the mark is gone), by its
    current folder inside `folder`: an orphan of this user's with no terminal, made since the
    command began. Linux's /proc; elsewhere nothing is found.
    """
    my_group = os.getpgrp()
    stopped: dict[int, str] = {}
    for pid, found in _commands_processes(folder, below, created_after):
        try:
            group = os.getpgid(pid)
            if group == my_group or group in stopped:
                continue
            os.killpg(group, signal.SIGKILL)
        except OSError:  # gone meanwhile
            continue
        stopped[group] = os.fsdecode(found)
    return stopped


_no_sweep_said = threading.Event()


def _say_no_sweep() -> None:
    """Once a process: with no /proc (macOS, BSD) what a command left outside its process group is not found."""
    if not _no_sweep_said.is_set():
        _no_sweep_said.set()
        from orchestrator.logs import get_logger

        get_logger().warning(
            "orphan_sweep_unavailable", reason="no /proc: processes a command started outside its process group (setsid, daemons) are not stopped"
        )


def _commands_processes(folder: Path, below: bool, created_after: ProcessClock | None = None) -> Iterator[tuple[int, bytes]]:
    """(pid, folder of its command) of each process, other than this one, that a command run in
    `folder` (`below`: under it) left; see stop_marked_processes.

    With `created_after` (when the command began), only processes made since: the few a command
    started, not every process on the host (reading each one's environment is most of a scan's cost).
    """
    wanted = os.fsencode(str(folder))
    inside = os.fsencode(os.path.realpath(folder))
    mark = b"\0" + os.fsencode(COMMAND_MARK) + b"="
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        _say_no_sweep()
        return
    if created_after is not None:
        pids = created_after.made_since(pids)
    me = os.getpid()
    spared: set[int] | None = None  # overnight and its parents, asked once, when first needed
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                variables = b"\0" + environ.read() + b"\0"
        except OSError:  # gone meanwhile, or not ours to read
            continue
        at = variables.find(mark)
        if at >= 0:
            start = at + len(mark)
            marked = variables[start : variables.index(b"\0", start)]
            if marked == wanted or below and marked.startswith(wanted + b"/"):
                yield pid, marked
            continue
        # A process that overwrote its environment (to set its title) is known by its folder, only
        # in the sweep after a command (made since it began) and only as an orphan: a live parent
        # outside (an editor whose helper runs in the worktree) is not the command's. Recovery, over
        # every process, goes by the mark alone: a person's detached editor there is no orphan of ours.
        if created_after is None:
            continue
        where = _folder_within(pid, inside, below)
        if where is None:
            continue
        if spared is None:
            spared = _me_and_my_parents()
        if _may_stop(pid, spared):
            yield pid, where


def _folder_within(pid: int, inside: bytes, below: bool) -> bytes | None:
    """The command folder (`inside`, or with `below` the folder under it) that the current folder
    of process `pid` is in; None when it is in neither, or cannot be read (another user's)."""
    try:
        current = os.readlink(f"/proc/{pid}/cwd".encode())
    except OSError:
        return None
    current = current.removesuffix(b" (deleted)")  # a folder a rollback removed
    if not below and current == inside:
        return inside
    if not current.startswith(inside + b"/"):
        return None
    return inside if not below else inside + b"/" + current[len(inside) + 1 :].split(b"/", 1)[0]



def _may_stop(pid: int, spared: set[int]) -> bool:
    """Whether a process found by its folder may be killed: this user's, with no terminal (not a
    person's shell in the worktree), neither overnight nor one of its parents, and an orphan (its
    parent init or a systemd: a daemon left behind), so never a live program's helper."""
    try:
        fields = stat_fields(pid)
        mine = os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except (OSError, IndexError):
        return False
    parent = int(fields[1])
    if parent != 1 and _name_of(parent) not in (b"systemd", b"init"):
        return False
    return mine and int(fields[4]) == 0 and pid not in spared


def _name_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/comm", "rb") as comm:
            return comm.read().strip()
    except OSError:
        return b""


def _me_and_my_parents() -> set[int]:
    chain, pid = set(), os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        try:
            pid = int(stat_fields(pid)[1])
        except (OSError, IndexError, ValueError):
            break
    return chain
