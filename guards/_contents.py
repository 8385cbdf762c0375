"""Which contents a written file has had during one run, so a write back to one of them is no progress.

A model that flip-flops (edit X to Y, check, edit Y back to X, check) or writes
the same content again makes successful writes that change nothing new. A write
counts as progress only when the file's content afterwards is one this run has
not seen: the content before the first write of a file counts as seen.

Files are read from the worktree (`ctx.workdir`): only regular files inside it,
up to a size; otherwise, or without a worktree, the call's own arguments stand
in for the content.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Iterable

from orchestrator.records import ToolCall

from guards._normalise import MISSING, PerCall, call_key, path_argument

# A bigger file is not read: its writes count as new, as before.
_MAX_BYTES = 2_000_000
_UNREADABLE = object()
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class FileVersions:
    """Hashes of each written file's contents in this run, keyed by the file's path."""

    def __init__(self) -> None:
        self._seen: dict[str, set[Any]] = {}

    def clear(self) -> None:
        self._seen.clear()

    def before(self, workdir: Path | None, calls: Iterable[ToolCall]) -> None:
        """Note the content of each file the calls will write, the first time it is written."""
        for call in calls:
            path = path_argument(call)
            if path is not None and path not in self._seen:
                self._seen[path] = {_content_once(workdir, path, call, "before")}

    def new_after(self, workdir: Path | None, call: ToolCall) -> bool:
        """After a successful write: whether the file now holds content not seen in this run."""
        path = path_argument(call)
        content = _written(call)
        if content is _UNREADABLE and path is not None:
            content = _content_once(workdir, path, call, "after")
        if content is _UNREADABLE:
            content = call_key(call)  # the same write again is still no news
        seen = self._seen.setdefault(path or "", set())
        if content in seen:
            return False
        seen.add(content)
        return True


def _written(call: ToolCall) -> Any:
    """What write_file left in the file, without reading it: its content, UTF-8 encoded, is the file's bytes."""
    content = call.arguments.get("content") if call.name == "write_file" else None
    if not isinstance(content, str):
        return _UNREADABLE
    try:
        return hash(content.encode("utf-8"))
    except UnicodeEncodeError:
        return _UNREADABLE


# Two guards ask about the same write at the same moment: the file is read once, before and after.
_recent = {"before": PerCall(16), "after": PerCall(16)}


def _content_once(workdir: Path | None, path: str, call: ToolCall, moment: str) -> Any:
    content = _recent[moment].get(call)
    if content is MISSING:
        content = _recent[moment].put(call, _content(workdir, path))
    return content


def _content(workdir: Path | None, path: str) -> Any:
    """A hash of the file's bytes, None when it does not exist, _UNREADABLE when it may not or cannot be read."""
    if workdir is None:
        return _UNREADABLE
    root = os.fspath(workdir)
    target = os.path.normpath(os.path.join(root, path))
    if not target.startswith(root.rstrip(os.sep) + os.sep):  # normpath took out any `..`: a prefix test suffices
        return _UNREADABLE  # outside the worktree (or the worktree itself): the toolbox refuses it, and so do we
    try:
        # Looked at before it is opened: opening a device (a link to one) may do something. A file about to be
        # created costs this one failed call.
        info = os.stat(target)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:
            return _UNREADABLE  # a pipe would block; a huge file is not worth reading
        # os.open/os.read, not open(): no buffered file object for one read. O_NONBLOCK: should the file have
        # become a pipe since the stat, nothing waits for a writer.
        fd = os.open(target, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # ValueError: a NUL in the path (the toolbox refuses the call too)
        return _UNREADABLE
    try:
        # One read of the size the stat gave, plus one byte: a shorter answer is the end of a regular file, so the
        # usual file costs no second read to learn that. Should it have grown since, the loop reads on.
        want = info.st_size + 1
        chunk = os.read(fd, want)
        if len(chunk) < want:
            return hash(chunk)
        chunks = [chunk]
        while True:
            chunk = os.read(fd, _MAX_BYTES + 1)
            if not chunk:
                break
            chunks.append(chunk)
        return hash(b"".join(chunks))
    except OSError:
        return _UNREADABLE
    finally:
        os.close(fd)
