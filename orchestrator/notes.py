"""notes.md: one entry per iteration rolled back or cancelled, for the next prompt and for breakfast.

Each append, and each trim of old entries (`[state] keep_notes_days`), rewrites the file whole under a lock
(`notes_file.rewrite`). The entries' format is `note_format.py`'s, the prompt's choice of them
`note_lessons.py`'s, and which bytes a trim keeps `note_trimming.py`'s.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Callable

from orchestrator.errors import StateError
from orchestrator.files import read_regular_file
from orchestrator.note_format import HEADER, NoteEntry, parsed_entries, render_entry
from orchestrator.note_lessons import lessons_for_prompt
from orchestrator.note_trimming import without_entries_before
from orchestrator.notes_file import locked, rewrite


class NotesBook:
    """Implements protocols.NotesBook over one markdown file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(
        self, *, task: str, iteration: int, reason: str, correction: str, evidence: str = "", when: datetime | None = None
    ) -> None:
        entry = render_entry(task=task, iteration=iteration, reason=reason, correction=correction, evidence=evidence, when=when)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with locked(self._lock_path()):
                rewrite(self.path, _with_entry(entry.encode("utf-8", "backslashreplace")), last_try_overwrites=True)
        except OSError as exc:
            raise StateError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def remove_entries_before(self, cutoff: datetime) -> int | None:
        """The entries whose header time is before `cutoff` removed (`note_trimming.without_entries_before`); how many,
        or None when a person's editor saved the file during every try (their edit wins: the trim waits for another night)."""
        removed = 0

        def trimmed(current: bytes | None) -> bytes | None:
            nonlocal removed
            if current is None:
                return None
            kept, removed = without_entries_before(current, cutoff)
            return kept if removed else None

        try:
            if not self.path.exists():  # inside: a folder that cannot be searched is logged, as a file that cannot be read
                return 0
            with locked(self._lock_path()):
                written = rewrite(self.path, trimmed, last_try_overwrites=False)
        except OSError as exc:
            raise StateError(f"cannot trim {self.path}: {exc.strerror or exc}") from None
        return removed if written else None

    def text(self) -> str:
        """The whole file ("" if there is none yet); bytes that are not UTF-8 (a hand edit) read as U+FFFD.

        A byte order mark an editor put first is dropped: it would hide an entry header right after it. Line
        ends an editor saved as CRLF read as LF: a carriage return is no part of what an entry says (it made
        the same lesson two, and reached the prompt).
        """
        try:
            return read_regular_file(self.path).decode("utf-8", errors="replace").removeprefix("\ufeff").replace("\r\n", "\n")
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror or exc}") from None

    def entries(self, task: str | None = None) -> list[NoteEntry]:
        return parsed_entries(self.text(), task)

    def for_task(self, task: str) -> list[str]:
        return [entry.text for entry in self.entries(task)]

    def for_prompt(self, task: str, budget_chars: int) -> str:
        """The task's entries with a person's hint, then the newest of its other entries that teach something,
        as many as fit in the budget, oldest first.

        Left out: entries that blame nothing (`cancelled`, `parked`) and older copies of a reason, correction
        and hint a newer entry gives: night after night of the same stop, or of deadlines, would otherwise
        push the one useful lesson out of the budget. What a person wrote into an entry is what the model
        most needs, so those entries come first, without their evidence where the budget is short. A
        newest entry too long for the budget alone still gives its header and correction (they come
        first), without its evidence: a small budget must not mean no notes.
        """
        return lessons_for_prompt(self.entries(task), budget_chars)

    def _lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")


def _with_entry(entry: bytes) -> Callable[[bytes | None], bytes]:
    """`entry` after everything in the file (its header first when there is none yet)."""

    def appended(current: bytes | None) -> bytes:
        # Bytes, not text: whatever a person wrote into the file stays exactly as written.
        return (HEADER.encode("utf-8") if current is None else current).rstrip(b"\r\n") + b"\n\n" + entry

    return appended
