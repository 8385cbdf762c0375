"""A JSONL transcript per iteration: every message, model call, tool call and signal, in order.

Each line is flushed as it is written, so a crash still leaves the record up to that point.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

from orchestrator.errors import StateError
from orchestrator.overnights_own import is_a_transcript_name


class Transcript:
    """Raises StateError (one line) when the file cannot be opened or written: a full disk, a read-only state dir."""

    def __init__(self, path: Path) -> None:
        """A new file at `path`, or, when that name is taken, at `<stem>.2.jsonl`, `.3`...: the store's ids
        start again when runs.db is deleted or `[store] url` changes, and one transcript must never hold
        two iterations. `self.path` is where it went."""
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for attempt in itertools.count(2):
                try:
                    # backslashreplace: a lone surrogate that got this far is written as its JSON escape, not a crash.
                    self._handle = self.path.open("x", encoding="utf-8", errors="backslashreplace")
                    break
                except FileExistsError:
                    if not self.path.is_file():  # not an earlier transcript: what opening it says is the answer
                        self._handle = self.path.open("a", encoding="utf-8", errors="backslashreplace")
                        break
                    self.path = path.with_name(f"{path.stem}.{attempt}{path.suffix}")
        except OSError as exc:
            raise _cannot_write(self.path, exc) from None

    def write(self, entry: str, **fields: Any) -> None:
        if self._handle.closed:
            return
        line = json.dumps({"t": round(time.time(), 3), "entry": entry, **fields}, ensure_ascii=False, default=str)
        try:
            self._handle.write(line + "\n")
            self._handle.flush()
        except OSError as exc:
            raise _cannot_write(self.path, exc) from None

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "Transcript":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        except OSError:
            pass  # the flush of a line already reported as unwritable


def _cannot_write(path: Path, exc: OSError) -> StateError:
    reason = "disk full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    return StateError(f"cannot write transcript {path}: {reason}")


def remove_older_than(folder: Path, days: float, now: float | None = None) -> tuple[int, list[str]]:
    """Delete the transcripts in `folder` last written more than `days` ago: how many went, and why
    any could not (one line each). Only plain files of the folder itself named as overnight names its
    transcripts (overnights_own.py): a link, a folder or a person's `.jsonl` put there is not a transcript
    of ours. The night that asks holds the state lock, so none of these is being written."""
    cutoff = (time.time() if now is None else now) - days * 86400
    removed, failures = 0, []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0, []
    except OSError as exc:
        return 0, [f"{folder}: {exc.strerror or exc}"]
    for entry in entries:
        try:
            if not is_a_transcript_name(entry.name) or not entry.is_file(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            failures.append(f"{entry.path}: {exc.strerror or exc}")
    return removed, failures
