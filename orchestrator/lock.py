"""One night per state dir: an flock on `<state_dir>/overnight.lock`.

The kernel drops an flock when its process dies, even by kill -9, so a lock
left by a dead process is never "stale": the next run simply gets it. The
holder's pid, host and start time are written into the file for the one-line
message a second run prints before exiting 75. `overnight serve` holds a lock of
the same kind on `<state_dir>/serve.lock`: one scheduler per state dir.

A state dir also has a name of its own (`state_identity`), kept beside the lock:
runs record it, so that in a run store several state dirs share (machines on one
PostgreSQL) each knows its own nights from the others'. Whoever holds the lock
knows that every run recorded under its name has ended, dead or not.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.errors import StateError
from orchestrator.files import read_regular_file

LOCK_NAME = "overnight.lock"
# One `serve` per state dir: two would each start every night, the second exiting 75 at once.
SERVE_LOCK_NAME = "serve.lock"
STATE_ID_NAME = "state-id"
EXIT_LOCKED = 75  # EX_TEMPFAIL: try again later


class LockHeld(Exception):
    """Another live process holds the state dir's lock."""

    def __init__(self, path: Path, holder: "Holder | None", holder_kind: str = "overnight run", *, message: str = "") -> None:
        who = holder.describe() if holder else "holder not recorded yet"
        # The holder's own command when it recorded one (`overnight gc` holds the night's lock too).
        super().__init__(message or f"another {holder.command if holder and holder.command else holder_kind} holds {path}: {who}")
        self.path = path
        self.holder = holder


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    since: datetime
    command: str = ""

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since.strftime('%Y-%m-%d %H:%M UTC')}"


class StateLock:
    """Exclusive use of a state dir for the length of a with-block.

    `name` and `holder_kind` make another lock of the same kind in the state dir, for another
    command (`serve.lock`, "overnight serve"): the message names what holds it.
    """

    def __init__(self, state_dir: Path, *, name: str = LOCK_NAME, holder_kind: str = "overnight run", command: str = "") -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / name
        self.holder_kind = holder_kind
        self.command = command or holder_kind  # what this process is, for the message of one that finds it held
        self._fd: int | None = None

    def __enter__(self) -> "StateLock":
        make_dir(self.state_dir)
        try:
            # Not through a symbolic link: the holder is written over the file, and emptied at release,
            # which would empty whatever file the link names (run from cron as root: any file at all).
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateError(f"cannot open {self.path}: a symbolic link, not the lock file overnight makes (remove the link)") from None
            raise StateError(f"cannot open {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(self.path)
            os.close(fd)
            raise LockHeld(self.path, holder, self.holder_kind) from None
        except OSError as exc:
            os.close(fd)
            raise StateError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        self._fd = fd
        try:
            self._write_holder(Holder(pid=os.getpid(), host=socket.gethostname(), since=datetime.now(timezone.utc), command=self.command))
        except OSError as exc:
            self._release()
            raise StateError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def check_still_held(self) -> None:
        """StateError if the lock file is no longer the one locked: the state dir was removed (or
        the file replaced), and a second night can take a fresh lock there and work on the same tasks."""
        assert self._fd is not None
        try:
            now = os.stat(self.path)
        except OSError:
            now = None
        locked = os.fstat(self._fd)
        if now is None or (now.st_dev, now.st_ino) != (locked.st_dev, locked.st_ino):
            raise StateError(f"{self.path} was removed or replaced while this night held it (the state dir deleted?): stopping, so that no other night works beside this one")

    def _write_holder(self, holder: Holder) -> None:
        record = {"pid": holder.pid, "host": holder.host, "since": holder.since.isoformat(), "command": holder.command}
        data = (json.dumps(record) + "\n").encode()
        assert self._fd is not None
        # Rewritten in place, never replaced: a new inode would not carry our flock.
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def _release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass  # a read-only or full disk must not keep the lock: the kernel frees it below
        # The file stays: unlinking it would let a newcomer lock a fresh inode
        # while a waiter still holds the old one.
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def read_holder(path: Path) -> Holder | None:
    """Who wrote the lock file last; None if empty (free, or just being taken) or unreadable."""
    try:
        record = json.loads(read_regular_file(Path(path)).decode("utf-8"))
        command = record.get("command")  # not in an older version's record
        return Holder(
            pid=int(record["pid"]), host=str(record["host"]), since=datetime.fromisoformat(record["since"]),
            command=command if isinstance(command, str) and command.isprintable() and len(command) <= 40 else "",
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def state_identity(state_dir: Path, *, create: bool = True) -> str | None:
    """The state dir's own name, a random id in `<state_dir>/state-id`, made on first use.

    Not its path: two machines can use the same path, and a state dir can move.
    `create=False` (read-only commands): None when there is none yet.
    """
    path = Path(state_dir) / STATE_ID_NAME
    try:
        known = read_regular_file(path).decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        known = ""
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    if known or not create:
        return known or None
    identity = uuid.uuid4().hex
    try:
        # Written whole, then renamed into place: a crash leaves no half-written name.
        temporary = path.with_name(f".{STATE_ID_NAME}.{identity}.tmp")
        temporary.write_text(identity + "\n", encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        raise StateError(f"cannot write {path}: {exc.strerror or exc}") from None
    return identity


def make_dir(path: Path, what: str = "state dir") -> None:
    """`path` (and its parents) as a folder, or StateError in one line saying what is in the way.
    Made for its owner alone: transcripts and the run store hold what the agent's commands printed."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise StateError(f"cannot create {what} {path}: a file is in the way") from None
    except NotADirectoryError:
        raise StateError(f"cannot create {what} {path}: a parent is a file, not a directory") from None
    except OSError as exc:
        reason = "disk full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        raise StateError(f"cannot create {what} {path}: {reason}") from None
