"""notes.md's entry format: an entry rendered from an iteration's ending, and the entries read back from the file's text.

An entry is its header (time, task, iteration, reason), the night's **Correction:** paragraph and its **Evidence:**
in a fenced block; every other line is a person's, up to a `#` or `##` heading of their own (`read_entry_lines`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterator

from orchestrator.printable import visible

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


@dataclass(frozen=True)
class NoteEntry:
    task: str
    iteration: int
    reason: str
    text: str
    # The time in its header, as written there (`stamp`).
    when: str = ""


def parsed_entries(text: str, task: str | None = None) -> list[NoteEntry]:
    """The entries in notes.md's `text`, oldest first; only `task`'s when it is given."""
    found = entry_headers(text)
    entries = []
    for (start, match), following in zip(found, [*found[1:], None]):
        end = following[0] if following else len(text)
        entry = NoteEntry(
            task=match["task"],
            iteration=int(match["iteration"]),
            reason=match["reason"],
            text=up_to_a_persons_section(text[start:end]).strip(),
            when=match["when"],
        )
        if task is None or entry.task == task:
            entries.append(entry)
    return entries


def up_to_a_persons_section(entry: str) -> str:
    """An entry up to a `#` or `##` heading of a person's own (outside its evidence): in markdown that ends
    the entry's section, and what follows it is about no task's next attempt, so no task's prompt takes it."""
    kept = [entry.partition("\n")[0], *(line for _, line in read_entry_lines(entry))]
    whole = len(kept) == entry.count("\n") + 1
    return entry if whole else "\n".join(kept) + "\n"


def read_entry_lines(entry: str) -> Iterator[tuple[str, str]]:
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
        elif opening := OPENING_FENCE.fullmatch(stripped):
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


# Markdown's two fences: a person's ~~~ block holds a `# comment` as a ``` block does (a tilde fence's info may hold a backtick).
OPENING_FENCE = re.compile(r"(`{3,})[^`]*|(~{3,}).*")
_SECTION = re.compile(r"#{1,2}(?:[ \t]|$)")


def stamp(moment: datetime) -> str:
    """How an entry's header shows the time it was written."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render_entry(*, task: str, iteration: int, reason: str, correction: str, evidence: str = "", when: datetime | None = None) -> str:
    written = stamp(when or datetime.now(timezone.utc))
    lines = [
        f"## {written} · task `{task}` · iteration {iteration} · `{header_reason(reason)}`",
        "",
        f"{CORRECTION_MARK} {no_html(visible(one_paragraph(correction)))}",
    ]
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


def entry_headers(text: str) -> list[tuple[int, re.Match[str]]]:
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


# What a markdown preview reads as markup in a name the model chose: `<` opens an HTML tag, `&` an entity
# (`&#x202E;` is a right-to-left override), a `[` before a `](` a link (its text may hold `[x]` or `\\]`), or with a `!`
# before it an image the preview loads. The backslashes the model wrote before one are doubled: `\\<` was an escaped
# backslash and a bare `<`.
_MARKUP = re.compile(r"(\\*)([<&])")
_MARKUP_OR_LINK = re.compile(r"(\\*)([<&\[])")
_MARKUP_ESCAPED = re.compile(r"((?:\\\\)*)\\([<&])")
_MARKUP_OR_LINK_ESCAPED = re.compile(r"((?:\\\\)*)\\([<&\[])")


def no_html(text: str) -> str:
    """A correction quotes what the model chose (a tool's name): a `<details>` there was an HTML tag in a markdown
    preview, and folded away every entry after it. Markdown's backslash escape keeps each a character."""
    return _around_last_link(text, _MARKUP_OR_LINK, _MARKUP, lambda found: found.group(1) * 2 + "\\" + found.group(2))


def html_escape_undone(text: str) -> str:
    """`text` as it read before no_html: the escape is for a markdown preview, not for the model's next prompt."""
    return _around_last_link(
        text, _MARKUP_OR_LINK_ESCAPED, _MARKUP_ESCAPED, lambda found: found.group(1)[: len(found.group(1)) // 2] + found.group(2)
    )


def _around_last_link(text: str, before: re.Pattern[str], after: re.Pattern[str], replaced: Callable[[re.Match[str]], str]) -> str:
    """`before` up to the last `](` (any `[` ahead of it may open a link), `after` from there. The escape adds only
    backslashes, never between `]` and `(`: the escaped text's last `](` is the same one, so the split undoes alike."""
    cut = max(text.rfind("]("), 0)
    return before.sub(replaced, text[:cut]) + after.sub(replaced, text[cut:])


def one_paragraph(text: str) -> str:
    return " ".join(text.split())


def _longest_backtick_run(text: str) -> int:
    runs = re.findall(r"`+", text)
    return max((len(r) for r in runs), default=0)
