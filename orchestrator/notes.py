"""notes.md: one entry per iteration rolled back or cancelled, for the next prompt and for breakfast.

Each append, and each trim of old entries (`[state] keep_notes_days`), rewrites
the file through a temporary file and an atomic rename, under an exclusive lock,
so a crash leaves the old file or the new one, never half an entry, and parallel
tasks never interleave. The file is read again just
before the rename, so what a person's editor saved while the new file was being
written is not lost with the old one.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Iterator

from orchestrator.errors import StateError
from orchestrator.files import read_regular_file, replace_file
from orchestrator.printable import shortened, visible

HEADER = (
    "# overnight notes\n\nWhat went wrong, one entry per iteration rolled back or cancelled"
    " (none when the model server could not be reached). Newest last.\n"
)
# An iteration's number is the run store's, 19 digits at most: a header a hand edit gave more is a person's own
# heading, not an entry (one of more than 4300 digits, which int() refuses, crashed every night and `overnight notes`).
_ENTRY = re.compile(
    r"^## (?P<when>[^·\n]+?) · task `(?P<task>[^`\n]+)` · iteration (?P<iteration>\d{1,19}) · `(?P<reason>[^`\n]+)`\r?$",
    re.MULTILINE,
)
MAX_EVIDENCE_CHARS = 1500
EVIDENCE_MARK = "**Evidence:**"
CORRECTION_MARK = "**Correction:**"
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
                _append_to(self.path, entry.encode("utf-8", "backslashreplace"))
        except OSError as exc:
            raise StateError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def remove_entries_before(self, cutoff: datetime) -> int | None:
        """The entries whose header time is before `cutoff` removed (`_without_entries_before`); how many, or None
        when a person's editor saved the file during every try (their edit wins: the trim waits for another night)."""
        removed = 0

        def trimmed(current: bytes | None) -> bytes | None:
            nonlocal removed
            if current is None:
                return None
            kept, removed = _without_entries_before(current, cutoff)
            return kept if removed else None

        try:
            if not self.path.exists():  # inside: a folder that cannot be searched is logged, as a file that cannot be read
                return 0
            with _locked(self.path.with_name(self.path.name + ".lock")):
                written = _rewrite(self.path, trimmed, last_try_overwrites=False)
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
        text = self.text()
        found = _headers(text)
        entries = []
        for (start, match), following in zip(found, [*found[1:], None]):
            end = following[0] if following else len(text)
            entry = NoteEntry(
                task=match["task"],
                iteration=int(match["iteration"]),
                reason=match["reason"],
                text=_up_to_a_persons_section(text[start:end]).strip(),
                when=match["when"],
            )
            if task is None or entry.task == task:
                entries.append(entry)
        return entries

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
        lessons = _lessons(self.entries(task))
        chosen = _with_hints(lessons, budget_chars)
        chosen = _with_the_newest_lessons(lessons, chosen, budget_chars)
        return _SEPARATOR.join(chosen[index] for index in sorted(chosen, reverse=True))


@dataclass(frozen=True)
class _Lesson:
    full: str  # the entry as the prompt gives it
    brief: str  # the same without its evidence
    hinted: bool  # a person wrote into it


def _lessons(entries: list[NoteEntry]) -> list[_Lesson]:
    """The entries worth a prompt, newest first, each reason, correction and hint once."""
    lessons: list[_Lesson] = []
    taught: set[tuple[str, str, str]] = set()
    for entry in reversed(entries):
        text = _FOR_THE_PERSON.sub("", entry.text)  # advice to the person, not the model
        parts = _parts_of(text)
        key = (entry.reason, parts.correction, parts.hint)
        # "None: ..." or "None needed: ..." is the correction of an entry that blames nothing (an error of
        # overnight's own); "None of your answers made a usable tool call" is a lesson. A person's hint
        # under any entry is one.
        blames_nothing = entry.reason in _NO_LESSON or _BLAMES_NOTHING.match(parts.correction)
        if (blames_nothing and not parts.hint) or key in taught:
            continue
        taught.add(key)
        lessons.append(_Lesson(full=text, brief=parts.brief, hinted=bool(parts.hint)))
    return lessons


def _with_hints(lessons: list[_Lesson], budget_chars: int) -> dict[int, str]:
    """The entries a person wrote into, newest first, without their evidence, as many as the budget holds
    (the last one cut to what is left)."""
    chosen: dict[int, str] = {}
    used = 0  # _size(chosen.values()), kept as it grows: a month of hinted entries is no quadratic walk
    for index, lesson in enumerate(lessons):
        if not lesson.hinted:
            continue
        room = budget_chars - used - (len(_SEPARATOR) if chosen else 0)
        if len(lesson.brief) > room:
            if room > 0:
                chosen[index] = shortened(lesson.brief, room)
            break
        used += len(lesson.brief) + (len(_SEPARATOR) if chosen else 0)
        chosen[index] = lesson.brief
    return chosen


def _with_the_newest_lessons(lessons: list[_Lesson], chosen: dict[int, str], budget_chars: int) -> dict[int, str]:
    """`chosen` and the newest other lessons that fit, whole, and the evidence of chosen ones where it fits."""
    chosen = dict(chosen)
    # The size so far, kept as it grows: measuring every choice afresh took 14 s at an iteration's start
    # for 20,000 different lessons under a budget that held them all.
    used = _size(chosen.values())
    for index, lesson in enumerate(lessons):
        if index in chosen:
            size_with_it = used - len(chosen[index]) + len(lesson.full)
        else:
            size_with_it = used + len(lesson.full) + (len(_SEPARATOR) if chosen else 0)
        if size_with_it <= budget_chars:
            chosen[index], used = lesson.full, size_with_it
        elif index not in chosen:
            if not chosen:
                chosen[index] = shortened(lesson.brief, budget_chars)
            break
    return chosen


def _size(texts: Iterable[str]) -> int:
    """Characters of texts joined for a prompt: the separators count too."""
    texts = list(texts)
    return sum(len(text) for text in texts) + len(_SEPARATOR) * max(len(texts) - 1, 0)


_BLAMES_NOTHING = re.compile(r"None(?: needed)?:")
_FOR_THE_PERSON = re.compile(r" ?\(For the person: [^)]*\)")
# Reasons whose entries say what happened but nothing the model should do differently.
_NO_LESSON = frozenset({"cancelled", "parked", "interrupted"})


@dataclass(frozen=True)
class _EntryParts:
    correction: str  # the night's correction as it now reads, on one line
    hint: str  # all else a person wrote into the entry, on one line
    brief: str  # the entry without its evidence


def _parts_of(entry: str) -> _EntryParts:
    """An entry read line by line (`_read`): the night wrote its header, its **Correction:** paragraph and its
    **Evidence:** with the fenced block after it; every other line is a person's."""
    header = entry.partition("\n")[0]
    brief, correction, person = [header], [], []
    for role, line in _read(entry):
        if role == "evidence":
            continue
        brief.append(line)
        if role == "correction":
            correction.append(line.removeprefix(CORRECTION_MARK) if not correction else line)
        else:
            person.append(line)
    return _EntryParts(
        correction=_one_paragraph(" ".join(correction)), hint=_one_paragraph(" ".join(person)), brief=_blank_lines_once("\n".join(brief))
    )


def _up_to_a_persons_section(entry: str) -> str:
    """An entry up to a `#` or `##` heading of a person's own (outside its evidence): in markdown that ends
    the entry's section, and what follows it is about no task's next attempt, so no task's prompt takes it."""
    kept = [entry.partition("\n")[0], *(line for _, line in _read(entry))]
    whole = len(kept) == entry.count("\n") + 1
    return entry if whole else "\n".join(kept) + "\n"


def _read(entry: str) -> Iterator[tuple[str, str]]:
    """Each line of an entry after its header with whose it is: "correction" (the night's paragraph, as a
    person may have edited it), "evidence" (the night's mark and the fenced block after it) or "person";
    up to a `#` or `##` heading of a person's own, which ends the entry.

    Fences are followed once, here, for both: a line in a fenced block is no heading and no mark (a
    person's ```python block may hold `# comment`, or quote an entry), and the block right after the
    evidence mark is the evidence whatever its opening says (a person may add `text` to it).
    """
    place = "body"  # or "correction" (its paragraph goes on), or "mark" (the evidence's fence comes next)
    fence, fence_role = None, ""
    has_correction = False
    for line in entry.split("\n")[1:]:
        stripped = line.strip()
        if fence is not None and fence_role == "evidence":
            fence, place = (None, "body") if stripped == fence else (fence, place)
            yield "evidence", line
            continue
        in_a_persons_fence = fence is not None
        if in_a_persons_fence:
            fence = None if stripped == fence else fence
        elif _SECTION.match(line):
            return
        elif opening := _OPENING_FENCE.fullmatch(stripped):
            fence, fence_role = opening[1] or opening[2], "evidence" if place == "mark" else "person"
            if fence_role == "evidence":
                yield "evidence", line
                continue
        if place == "mark" and not stripped:
            yield "evidence", line
        elif not in_a_persons_fence and line.startswith(EVIDENCE_MARK):
            place = "mark"
            yield "evidence", line
        elif place == "correction" and stripped:
            yield "correction", line
        elif not has_correction and not in_a_persons_fence and line.startswith(CORRECTION_MARK):
            has_correction, place = True, "correction"
            yield "correction", line
        else:
            place = "body"
            yield "person", line


def _blank_lines_once(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# Markdown's two fences: a person's ~~~ block holds a `# comment` as a ``` block does (a tilde fence's info may hold a backtick).
_OPENING_FENCE = re.compile(r"(`{3,})[^`]*|(~{3,}).*")
_SECTION = re.compile(r"#{1,2}(?:[ \t]|$)")
_FENCE_SHAPED = re.compile(r"^[^\S\n]*(?:`{3}|~{3}).*", re.MULTILINE)


def stamp(moment: datetime) -> str:
    """How an entry's header shows the time it was written."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render_entry(*, task: str, iteration: int, reason: str, correction: str, evidence: str = "", when: datetime | None = None) -> str:
    written = stamp(when or datetime.now(timezone.utc))
    lines = [f"## {written} · task `{task}` · iteration {iteration} · `{header_reason(reason)}`", "", f"{CORRECTION_MARK} {visible(_one_paragraph(correction))}"]
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


# Reads of notes.md that a person's editor may find changed before an append writes it regardless (see _append_to).
_TRIES_WHILE_EDITED = 5


def _append_to(path: Path, entry: bytes) -> None:
    """`entry` after everything in the file at `path`, through a new file renamed over it (`_rewrite`)."""

    def appended(current: bytes | None) -> bytes:
        # Bytes, not text: whatever a person wrote into the file stays exactly as written.
        return (HEADER.encode("utf-8") if current is None else current).rstrip(b"\r\n") + b"\n\n" + entry

    _rewrite(path, appended, last_try_overwrites=True)


def _rewrite(path: Path, change: Callable[[bytes | None], bytes | None], *, last_try_overwrites: bool) -> bool:
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


def _without_entries_before(data: bytes, cutoff: datetime) -> tuple[bytes, int]:
    """`data` without the entries whose header time is before `cutoff`, and how many went.

    An entry goes with all a person wrote into it, up to the next entry or a `#` or `##` heading of a
    person's own (`_up_to_a_persons_section`), which is no entry's and stays, as does all above the first
    entry. An entry whose header time does not read as `stamp` writes it (a person changed it) stays.
    A header-shaped line in a fenced block goes or stays with the entry around it (`_entries_around_quotes`).
    Bytes that are not UTF-8, a byte order mark and CRLF line ends are kept as they are.
    """
    bom = "\ufeff" if data.startswith(b"\xef\xbb\xbf") else ""
    text = data.decode("utf-8", errors="surrogateescape").removeprefix(bom)
    found = _entries_around_quotes(text, _headers(text))
    kept, removed, copied_up_to = [bom], 0, 0
    for headers, following in zip(found, [*found[1:], None]):
        written = [_time_of(match["when"]) for _, match in headers]
        if any(time is None or time >= cutoff for time in written):
            continue
        start, end = headers[0][0], following[0][0] if following else len(text)
        kept.append(text[copied_up_to:start])
        copied_up_to, removed = start + len(_up_to_a_persons_section(text[start:end])), removed + 1
    kept.append(text[copied_up_to:])
    result = "".join(kept)
    if removed and copied_up_to == len(text):  # the last entry went: no blank lines left trailing, a CRLF file's line end kept
        ending = "\r\n" if result.endswith("\r\n") else "\n"
        result = result.rstrip("\r\n") + ending
    return result.encode("utf-8", errors="surrogateescape"), removed


def _entries_around_quotes(text: str, found: list[tuple[int, re.Match[str]]]) -> list[list[tuple[int, re.Match[str]]]]:
    """The headers `found`, each with those in a fenced block opened after it (evidence an older version wrote
    unindented, a person quoting an entry): a trim that took a quoted old header for an entry cut the newer entry
    around it in half, a person's lines after it gone and its fence left open. Fences are followed only here:
    one a hand edit left open keeps the entries after it in its entry's, which then goes only if all of them are old."""
    entries: list[list[tuple[int, re.Match[str]]]] = []
    fence: str | None = None
    for (start, match), following in zip(found, [*found[1:], None]):
        if fence is None:
            entries.append([(start, match)])
        else:
            entries[-1].append((start, match))
        # Only lines that may open or close a fence, found in place: a walk over every line took 50 MB's trim from 6 s to 13.
        for line in _FENCE_SHAPED.finditer(text, match.end(), following[0] if following else len(text)):
            stripped = line[0].strip()
            if fence is not None:
                fence = None if stripped == fence else fence
            elif opening := _OPENING_FENCE.fullmatch(stripped):
                fence = opening[1] or opening[2]
    return entries


def _time_of(when: str) -> datetime | None:
    """An entry header's time (`stamp`), None where it reads otherwise."""
    try:
        return datetime.strptime(when, "%Y-%m-%d %H:%M UTC").replace(tzinfo=timezone.utc)
    except ValueError:
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
