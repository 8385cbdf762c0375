"""The notes.md entries a task's next prompt is given: the lessons among them, chosen to fit a budget of characters."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from orchestrator.note_format import CORRECTION_MARK, NoteEntry, html_escape_undone, one_paragraph, read_entry_lines
from orchestrator.printable import shortened

_SEPARATOR = "\n\n"  # between entries in a prompt


def lessons_for_prompt(entries: list[NoteEntry], budget_chars: int) -> str:
    """A task's `entries` (oldest first) as its prompt gives them: see NotesBook.for_prompt."""
    lessons = _lessons(entries)
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
        lessons.append(_Lesson(full=parts.full, brief=parts.brief, hinted=bool(parts.hint)))
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
    full: str  # the entry


def _parts_of(entry: str) -> _EntryParts:
    """An entry read line by line (`read_entry_lines`): the night wrote its header, its **Correction:** paragraph and
    its **Evidence:** with the fenced block after it; every other line is a person's.

    The correction's `\\<` (note_format.no_html, for a markdown preview) is a `<` again: the model reads the name it
    called, `<details>`, and an entry written before that escape is the same lesson as one written after it."""
    header, *body = entry.split("\n")
    brief, full, correction, person = [header], [header], [], []
    for role, line in read_entry_lines(entry):
        line = html_escape_undone(line) if role == "correction" else line
        full.append(line)
        if role == "evidence":
            continue
        brief.append(line)
        if role == "correction":
            correction.append(line.removeprefix(CORRECTION_MARK) if not correction else line)
        else:
            person.append(line)
    return _EntryParts(
        correction=one_paragraph(" ".join(correction)),
        hint=one_paragraph(" ".join(person)),
        brief=_blank_lines_once("\n".join(brief)),
        full="\n".join(full + body[len(full) - 1 :]),  # a person's own section after it, if any, as it is
    )


def _blank_lines_once(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip()
