"""The repository's config, which the user's checkout shares, put back as it was: once the agent's commands
that ran at once have all ended (`kept_config`), and, after a night killed while one ran, by the next night's
recovery from the copy the first of them kept (`restore_config_copy`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

from orchestrator.files import replace_file

CONFIG_RESTORED = (
    "[overnight: this command changed the repository's git config, which the user's own checkout shares; "
    "overnight puts it back as it was. Commits here need no git settings.]"
)


class kept_config:
    """A with-block around one agent command: the file at `path` is put back as it was when the first
    of the commands running at once began, once the last of them has ended (several tasks' commands
    overlap; each restoring its own "before" would put another's change back). `.restored` says
    whether this command changed it."""

    _lock = threading.Lock()
    _held: dict[str, list] = {}  # real path -> [commands running, bytes before the first]

    def __init__(self, path: Path | None, copy: Path | None = None) -> None:
        # The link's target: a `.git/config` that is a symlink stays one.
        self._path = os.path.realpath(path) if path is not None else None
        self._copy = copy
        self._own_before: bytes | None = None
        self.restored = False

    def __enter__(self) -> "kept_config":
        if self._path is None:
            return self
        with self._lock:
            self._own_before = _read(self._path)
            held = self._held.get(self._path, [0, self._own_before])
            if held[0] == 0 and self._copy is not None and self._own_before is not None:
                _save_copy(self._copy, self._path, self._own_before)
            held[0] += 1
            # Held only once the copy is kept: a copy that failed (a full disk) left this "before" behind for a
            # later command, maybe nights later under serve, to put back over the user's changes since.
            self._held[self._path] = held
        return self

    def __exit__(self, *exc: object) -> None:
        if self._path is None:
            return
        with self._lock:
            held = self._held[self._path]
            held[0] -= 1
            now = _read(self._path)
            self.restored = now != self._own_before
            if held[0] == 0:
                del self._held[self._path]
                if now != held[1]:
                    _put_back(Path(self._path), held[1])
                if self._copy is not None:
                    self._copy.unlink(missing_ok=True)


# The copy: this marker, the SHA-256 (hex) of the rest, then the path of the file it is a copy of and the file's
# bytes; NULs between, as no path holds one (a line break, which a folder's name may hold, did end the path once).
# The digest tells a whole copy from one a crash cut short or a disk garbled, which is never put back.
_COPY_MARKER = b"overnight: a checked copy of a config\0"
# The copy an older version kept: this, the path, a line break, the file's bytes. Read still, for a night it
# left killed; with no digest, only when the path names a file that is there (see _legacy_copy).
_LEGACY_HEADER = b"overnight: a copy of "


def _save_copy(copy: Path, path: str, before: bytes) -> None:
    """Whole or not at all, so that recovery never puts back half a config. Not synced (one write per
    agent command): what a killed process wrote survives it; a power loss may take the copy."""
    body = os.fsencode(path) + b"\0" + before
    digest = hashlib.sha256(body).hexdigest().encode()
    # Only the user may read it, as they may have made the config itself (it can hold a remote's token).
    replace_file(copy, _COPY_MARKER + digest + b"\0" + body, mode=0o600, sync=False)


def restore_config_copy(copy: Path) -> str | None:
    """After a night killed while the agent's commands ran: the repository's config put back from the copy
    its first command kept, if a command changed it. The config's path when it was put back, else None.
    A copy that is not whole (a power loss took its end) is removed and nothing put back."""
    try:
        saved = copy.read_bytes()
    except FileNotFoundError:
        return None
    kept = _checked_copy(saved) if saved.startswith(_COPY_MARKER) else _legacy_copy(saved)
    restored = None
    if kept is not None:
        path, before = kept
        if _read(path) != before:
            _put_back(Path(path), before)
            restored = path
    copy.unlink(missing_ok=True)
    return restored


def _checked_copy(saved: bytes) -> tuple[str, bytes] | None:
    digest, _, body = saved[len(_COPY_MARKER):].partition(b"\0")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        return None
    path, found, before = body.partition(b"\0")
    if not found or not os.path.isabs(path):
        return None
    return os.fsdecode(path), before


def _legacy_copy(saved: bytes) -> tuple[str, bytes] | None:
    header, found, before = saved.partition(b"\n")
    if not found or not header.startswith(_LEGACY_HEADER):
        return None  # cut inside its first line: the path in it may be a prefix of the config's, another file's
    path = os.fsdecode(header[len(_LEGACY_HEADER):])
    # A config whose path held a line break was cut at it: what is left names another file, most often none
    # or a folder (the repository's parent). Only a file that is there is taken for the config.
    if not os.path.isabs(path) or not os.path.isfile(path):
        return None
    return path, before


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _put_back(path: Path, before: bytes | None) -> None:
    if before is None:
        path.unlink(missing_ok=True)
        return
    # Whole or not at all: git reads this file in every process, the user's too. With the mode and
    # owner it has: a config only its owner may read (it can hold a token) stays so.
    try:
        now = os.stat(path)
        mode, owner = stat.S_IMODE(now.st_mode), (now.st_uid, now.st_gid)
    except FileNotFoundError:
        mode, owner = None, None
    replace_file(path, before, mode=mode, owner=owner, sync=False)
