"""notes.md: one entry per iteration that did not commit, for the next prompt and for breakfast.

Each append rewrites the file through a temporary file and an atomic rename,
under an exclusive lock, so a crash leaves the old file or the new one, never
half an entry, and parallel tasks never interleave.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.errors import StateError
from orchestrator.files import read_regular_file, replace_file
from orchestrator.printable import shortened, visible

HEADER = "# overnight notes\n\nWhat went wrong, one entry per iteration that did not commit. Newest last.\n"
_ENTRY = re.compile(
    r"^## (?P<when>[^·\n]+?) · task `(?P<task>[^`\n]+)` · iteration (?P<iteration>\d+) · `(?P<reason>[^`\n]+)`\r?$",
    re.MULTILINE,
)
MAX_EVIDENCE_CHARS = 1500
EVIDENCE_MARK = "**Evidence:**"
_SEPARATOR = "\n\n"  # between entries in a prompt


@dataclass(frozen=True)
class NoteEntry:
    task: str
    iteration: int
    reason: str
    text: str
    # The time in its header, as written there (`stamp`).
    when: str = ""


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
            with _locked(self.path.with_name(self.path.name + ".lock")):
                # Bytes, not text: whatever a person wrote into the file stays exactly as written.
                current = read_regular_file(self.path) if self.path.exists() else HEADER.encode("utf-8")
                data = current.rstrip(b"\n") + b"\n\n" + entry.encode("utf-8", "backslashreplace")
                _write_atomically(self.path, data, mode=_mode_of(self.path))
        except OSError as exc:
            raise StateError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def text(self) -> str:
        """The whole file ("" if there is none yet); bytes that are not UTF-8 (a hand edit) read as U+FFFD.

        A byte order mark an editor put first is dropped: it would hide an entry header right after it.
        """
        try:
            return read_regular_file(self.path).decode("utf-8", errors="replace").removeprefix("\ufeff")
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror or exc}") from None

    def entries(self, task: str | None = None) -> list[NoteEntry]:
        text = self.text()
        found = _headers(text)
        entries = []
        for (start, match), following in zip(found, [*found[1:], None]):
            end = following[0] if following else len(text)
            entry = NoteEntry(
                task=match["task"], iteration=int(match["iteration"]), reason=match["reason"], text=text[start:end].strip(), when=match["when"]
            )
            if task is None or entry.task == task:
                entries.append(entry)
        return entries

    def for_task(self, task: str) -> list[str]:
        return [entry.text for entry in self.entries(task)]

    def for_prompt(self, task: str, budget_chars: int) -> str:
        """The newest of the task's entries that teach something and fit in the budget, oldest first.

        Left out: entries that blame nothing (`cancelled`, `parked`) and older copies of a reason and correction
        a newer entry gives: night after night of the same stop, or of deadlines, would otherwise push the
        one useful lesson out of the budget. A newest entry too long for the budget alone still gives
        its header and correction (they come first), without its evidence: a small budget must not
        mean no notes.
        """
        chosen: list[str] = []
        taught: set[tuple[str, str]] = set()
        used = 0
        for entry in reversed(self.entries(task)):
            lesson = (entry.reason, _correction_of(entry.text))
            # "None: ..." or "None needed: ..." is the correction of an entry that blames nothing (an error of
            # overnight's own); "None of your answers made a usable tool call" is a lesson.
            if entry.reason in _NO_LESSON or _BLAMES_NOTHING.match(lesson[1].removeprefix("**Correction:**").strip()) or lesson in taught:
                continue
            taught.add(lesson)
            text = _FOR_THE_PERSON.sub("", entry.text)  # advice to the person, not the model
            cost = len(text) + (len(_SEPARATOR) if chosen else 0)  # the separators count too
            if used + cost > budget_chars:
                if not chosen:
                    chosen.append(_shortened(text, budget_chars))
                break
            chosen.append(text)
            used += cost
        return _SEPARATOR.join(reversed(chosen))


_BLAMES_NOTHING = re.compile(r"None(?: needed)?:")
_FOR_THE_PERSON = re.compile(r" ?\(For the person: [^)]*\)")
# Reasons whose entries say what happened but nothing the model should do differently.
_NO_LESSON = frozenset({"cancelled", "parked", "interrupted"})


def _correction_of(entry: str) -> str:
    """An entry's correction: what follows its header, up to its evidence."""
    body = entry.split("\n", 1)[1] if "\n" in entry else ""
    return body.split(EVIDENCE_MARK, 1)[0].strip()


def _shortened(entry: str, budget_chars: int) -> str:
    return shortened(entry.split(EVIDENCE_MARK, 1)[0].rstrip(), budget_chars)


def stamp(moment: datetime) -> str:
    """How an entry's header shows the time it was written."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render_entry(*, task: str, iteration: int, reason: str, correction: str, evidence: str = "", when: datetime | None = None) -> str:
    written = stamp(when or datetime.now(timezone.utc))
    lines = [f"## {written} · task `{task}` · iteration {iteration} · `{header_reason(reason)}`", "", f"**Correction:** {visible(_one_paragraph(correction))}"]
    if evidence.strip():
        shown = visible(evidence.strip(), keep="\n\t")
        if len(shown) > MAX_EVIDENCE_CHARS:
            shown = "…" + shown[-MAX_EVIDENCE_CHARS:]
        fence = "`" * max(3, _longest_backtick_run(shown) + 1)
        lines += ["", EVIDENCE_MARK, "", fence, _no_headers(shown), fence]
    return "\n".join(lines) + "\n"


def header_reason(reason: str) -> str:
    """A reason code as an entry's header shows it. A user guard's own code is any string: a backtick in it
    ended the header's pattern, so the entry read as part of the one before it (another task's prompt
    then carried it), and a line break in it could start an entry of its own, for any task."""
    return visible(" ".join(reason.split())).replace("`", "'") or "?"


def _headers(text: str) -> list[tuple[int, re.Match[str]]]:
    """Each entry header with where it starts.

    Any line shaped like a header is one: evidence cannot hold such a line (`_no_headers`),
    and fences are not followed, so a fence a person's hand edit left open (the top of the
    file pruned down to the middle of an entry) cannot hide every entry after it.
    """
    return [(match.start(), match) for match in _ENTRY.finditer(text)]


def _no_headers(evidence: str) -> str:
    """Evidence quotes output (a check's, the model's), which can print a line shaped like an
    entry header: indented by a space, it can neither forge an entry nor cut its own."""
    return "\n".join(f" {line}" if _ENTRY.fullmatch(line) else line for line in evidence.split("\n"))


def _one_paragraph(text: str) -> str:
    return " ".join(text.split())


def _longest_backtick_run(text: str) -> int:
    runs = re.findall(r"`+", text)
    return max((len(r) for r in runs), default=0)


def _mode_of(path: Path) -> int | None:
    """The permissions of the notes.md there is, which its replacement keeps: a person's `chmod 600` (it quotes
    the checks' output) was undone by the next entry, the new file made as any new one (0666 less the umask)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def _write_atomically(path: Path, data: bytes, mode: int | None = None) -> None:
    replace_file(path, data, mode=mode)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class _locked:
    """An exclusive flock held for the duration of a with-block (threads and processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
