"""notes.md's file, rewritten whole: under an exclusive lock, through a temporary file and an atomic rename, synced.

A crash leaves the old file or the new one, never half an entry, and parallel tasks never interleave. The file is
read again just before the rename, so what a person's editor saved while the new file was being written is not lost
with the old one.
"""

from __future__ import annotations

import fcntl
import functools
import os
import stat
from pathlib import Path
from typing import Callable

from orchestrator.files import read_regular_file, replace_file

# Reads of notes.md that a person's editor may find changed before an append writes it regardless (see `rewrite`).
_TRIES_WHILE_EDITED = 5


def rewrite(path: Path, change: Callable[[bytes | None], bytes | None], *, last_try_overwrites: bool) -> bool:
    """The file at `path` replaced by `change` of its bytes (None from `change`: nothing to write); False when a
    person's editor saved it during every try and `last_try_overwrites` is not set.

    The lock keeps nights from interleaving, not a person's editor: a save between the read and the
    rename was lost. So the file is read again right before the rename, once the new file is on the
    disk (its write and fsync, the slow part, done), and if it changed the change starts again from
    what is there now. A save can still fall between that second read and the rename (microseconds,
    not the milliseconds to seconds of an fsync on a busy disk). An editor saving during every one of
    `_TRIES_WHILE_EDITED` tries has its last save written over by an append, as before, rather than keep
    the entry out for good; a trim, which can wait for the next night, gives up instead.
    """
    for tries_left in reversed(range(_TRIES_WHILE_EDITED)):
        current = _bytes_at(path)
        data = change(current)
        if data is None:
            return True
        check = functools.partial(_still_holds, path, current) if tries_left or not last_try_overwrites else None
        if replace_file(path, data, mode=_mode_of(path), still_wanted=check):
            break
    else:
        return False
    _sync_folder(path.parent)
    return True


def _mode_of(path: Path) -> int | None:
    """The permissions of the notes.md there is, which its replacement keeps: a person's `chmod 600` (it quotes
    the checks' output) was undone by the next entry, the new file made as any new one (0666 less the umask)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def _bytes_at(path: Path) -> bytes | None:
    """The file's bytes, None where there is none (as Path.exists() has it: a dangling link, a link loop)."""
    try:
        return read_regular_file(path) if path.exists() else None
    except FileNotFoundError:  # deleted since
        return None


def _still_holds(path: Path, read: bytes | None) -> bool:
    """Whether the file at `path` still holds what was read (None: still no file). The bytes, not the
    mtime: a same-size save within the clock's tick (a typo fixed in place) leaves the stat as it was."""
    return _bytes_at(path) == read


def _sync_folder(folder: Path) -> None:
    """The rename made durable."""
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class locked:
    """An exclusive flock held for the duration of a with-block (threads and processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
