"""The state dir kept out of the user's `git status` when it lives inside the checkout (the default `.overnight`,
beside an `overnight.toml` there): one line in the repository's info/exclude, never in a tracked file.

Written by whichever command makes the state dir first (run, gc, serve: the lock file, runs.db), before the first
night's worktree, and again as each task's worktree is registered (a state dir an older overnight made).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import StateError

if TYPE_CHECKING:
    from collections.abc import Iterator

# Taken literally once escaped: a state dir named `*` or `[ab]` is that folder, not every folder of the checkout.
_PATTERN_CHARACTERS = re.compile(r"([\\*?\[])")


def make_state_dir(repo, state_dir: Path) -> None:
    """The state dir made (`lock.make_dir`); when it is not there yet, its exclude line is written first: a
    `git add -A` in the checkout took the lock file and runs.db a `gc` or `serve` had made before any night."""
    from orchestrator.files import looked_up
    from orchestrator.lock import make_dir

    if looked_up(state_dir, StateError, "state dir") is None:
        exclude_state_dir(repo, state_dir)
    make_dir(state_dir)


def exclude_state_dir(repo, state_dir: Path) -> None:
    """The line `/<state dir>/` in the common dir's info/exclude, once, when the state dir is inside the checkout.

    The common dir's: git reads it from there for every worktree, the user's checkout too when that is itself a
    linked worktree. An info/exclude, or info folder, that is a symbolic link (it may lead out of the git dir) or not
    a regular file (a pipe would block the night, a device be written to) is left as it is. StateError (one line)
    when the line is missing and the file cannot be written.
    """
    top = Path(repo.working_tree_dir).resolve()
    try:
        relative = state_dir.resolve().relative_to(top)
    except ValueError:
        return
    name = _PATTERN_CHARACTERS.sub(r"\\\1", relative.as_posix())
    if "\n" in name:  # no line of the file can hold it
        return
    exclude = Path(repo.common_dir) / "info" / "exclude"
    try:
        _append_once(exclude, os.fsencode(f"/{name}/"))  # a name not in UTF-8 as its bytes, as git reads it
    except OSError as exc:
        raise StateError(f"cannot write {exclude}: {exc.strerror or exc}") from None


def _append_once(exclude: Path, line: bytes) -> None:
    """`line` added to the regular file `exclude` unless it holds it; the folder and file made when missing."""
    with contextlib.suppress(FileExistsError):  # whatever is there (a link too) is looked at next
        exclude.parent.mkdir()
    if not stat.S_ISDIR(os.lstat(exclude.parent).st_mode):
        return
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(exclude).st_mode):
            return
        # Read before it is opened for writing: an exclude nobody may write that has the line is no error.
        with _regular_file(exclude, os.O_RDONLY) as handle:
            if handle is None or line in handle.readall().splitlines():
                return
    with _regular_file(exclude, os.O_RDWR | os.O_APPEND | os.O_CREAT) as handle:
        if handle is None:
            return
        # Read again under the lock: two commands that make the state dir at once (two `gc`) wrote the line twice.
        with contextlib.suppress(OSError):  # a file system without locks: written as before, unlocked
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released as the file closes
        # Bytes: the file is the user's, in whatever encoding they wrote it.
        existing = handle.readall()
        if line not in existing.splitlines():
            handle.write((b"" if existing.endswith(b"\n") or not existing else b"\n") + line + b"\n")


@contextlib.contextmanager
def _regular_file(path: Path, flags: int) -> Iterator[io.FileIO | None]:
    """`path` opened with `flags`, unbuffered (a buffered one refuses a pipe before the check); None when it is not a
    regular file. O_NOFOLLOW and the fstat: a link or a pipe put there since the lstat is refused too, never followed
    or waited on."""
    descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    with open(descriptor, "r+b" if flags & os.O_RDWR else "rb", buffering=0) as handle:
        yield handle if stat.S_ISREG(os.fstat(descriptor).st_mode) else None
