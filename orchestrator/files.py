"""A file written whole or not at all: the one way overnight replaces a file it must not leave half written;
a state file read only when it is a file; a path removed whatever it is, never through a link; and what is at a path
the user gave, looked at without a traceback."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Callable

# A name longer than this leaves no room in 255 bytes for the temporary file's own.
_LONGEST_NAME_KEPT = 200


def replace_file(
    path: Path,
    data: bytes,
    *,
    mode: int | None = None,
    owner: tuple[int, int] | None = None,
    sync: bool = True,
    still_wanted: Callable[[], bool] | None = None,
) -> bool:
    """`path` replaced by a new file holding `data`, or left as it was; False when `still_wanted` said no.

    A temporary file beside it (`.<name>.<random>.tmp`, so recovery can tell debris by its
    name), written, given `mode` (else the mode any new file gets: 0666 less the umask),
    `owner` where we may, synced with `sync`, then renamed over `path`; removed if anything fails.
    `still_wanted` is asked last, once the new file is on the disk, right before the rename: the
    moment nearest it where `data` can still be dropped.
    """
    name = path.name if len(os.fsencode(path.name)) <= _LONGEST_NAME_KEPT else "overnight"
    temporary = path.with_name(f".{name}.{secrets.token_hex(4)}.tmp")
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            if owner is not None:
                with contextlib.suppress(OSError):  # only root may give a file away
                    os.fchown(out.fileno(), *owner)
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            if sync:
                os.fsync(out.fileno())
        if still_wanted is not None and not still_wanted():
            os.unlink(temporary)
            return False
        os.replace(temporary, path)
        return True
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_over(fd: int, data: bytes) -> None:
    """`data` written over the old bytes of a file just opened (at its start), then the file cut to length.

    Not truncated first: ext4 (auto_da_alloc) forces a file truncated to zero onto the disk
    when it is closed, and a full disk fails before the file is emptied.
    """
    remaining = memoryview(data)
    while remaining:
        remaining = remaining[os.write(fd, remaining) :]
    os.ftruncate(fd, len(data))


def read_regular_file(path: Path, most: int = -1) -> bytes:
    """The bytes of `path` (its first `most`, when not -1), which must be a regular file (else OSError, "not a regular file").

    A pipe put where a state file goes (`mkfifo notes.md`) blocked the night, deaf to SIGTERM,
    until something wrote into it; a device would be read for ever.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a pipe's open waits for a writer without it
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", closefd=False) as opened:
            return opened.read(most)
    finally:
        os.close(descriptor)


def remove_entry(path: Path) -> None:
    """`path` gone, whatever the agent made of it: a folder removed with what it holds, a link or a file unlinked (never
    what a link leads to)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def absolute(path: Path, error: type[Exception], what: str) -> Path:
    """`path` made absolute, or `error` in one line: a relative one cannot be when the folder the shell
    stands in was removed since it went there (os.getcwd() raises FileNotFoundError, a traceback)."""
    try:
        return Path(os.path.abspath(path))
    except FileNotFoundError:
        raise error(f"{what} {path}: the current folder no longer exists (cd into one that does)") from None


def looked_up(path: Path, error: type[Exception], what: str = "") -> os.stat_result | None:
    """`path`'s stat (links followed), None where nothing is (as Path.exists() says); `error` in one line
    where it cannot be looked at. Path.exists() and is_dir() raise those as they are, a traceback: a folder
    on the way that this user may not enter (cron's user is not the config's owner), a name too long."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink loop: nothing there, as Path.exists() has it
            return None
        raise error(f"cannot look at {what + ' ' if what else ''}{path}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the name: nothing there, as Path.exists() has it
        return None
