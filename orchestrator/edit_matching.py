"""edit_file's `old` looked for in a file's text: how often it is there and, when it is not, what to tell the model
(the lines that hold it with other spaces or indentation, or the search label copied with it)."""

from __future__ import annotations

import re
from bisect import bisect_right

# An `old` found this often is counted no further: the model only needs to hear it is not unique.
MOST_OCCURRENCES_COUNTED = 1000


def occurrences(text: str, old: str) -> int:
    """How often `old` is in `text`, overlapping ones too (str.count finds "a\na" once in "a\na\na"),
    up to MOST_OCCURRENCES_COUNTED."""
    count, at = 0, -1
    while count < MOST_OCCURRENCES_COUNTED and (at := text.find(old, at + 1)) >= 0:
        count += 1
    return count


def not_found_message(path: str, old: str, text: str) -> str:
    alike = _lines_alike(old, text)
    if alike:
        first, last = alike
        lines = text.split("\n")[first - 1 : last]
        # Shown as read_file shows them: a byte that is not UTF-8 (surrogateescape) as \ufffd.
        quoted = "\n".join(_as_shown(line.rstrip("\r")) for line in lines)
        return (
            f"`old` was not found exactly in {path}, but similar text with different spaces or indentation is "
            f"there, at lines {first}-{last}; copy `old` exactly from these lines:\n{quoted}"
        )
    label = _SEARCH_LABEL.match(old)
    if label and label.group(0) not in text:
        # Copied from search's output with its `file:line: ` label, which the file does not hold.
        return f"`old` was not found in {path}: it starts with {label.group(0)!r}, search's label for the line; leave that out"
    return f"`old` was not found in {path}; read_file to see its current text and copy `old` exactly from it"


# How search labels each line it shows: `path:line: `.
_SEARCH_LABEL = re.compile(r"[^\n:]+:\d+: ")


def _as_shown(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _lines_alike(old: str, text: str) -> tuple[int, int] | None:
    """The first and last line (from 1) of `text` that hold `old` when each line's surrounding
    whitespace and the blank lines are ignored; None when it is not there even so."""
    wanted = _squeeze(old)
    if not wanted:
        return None
    offsets: list[int] = []  # where each kept line starts in the squeezed text
    numbers: list[int] = []
    kept: list[str] = []
    offset = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            offsets.append(offset)
            numbers.append(number)
            kept.append(line.strip())
            offset += len(kept[-1]) + 1
    at = "\n".join(kept).find(wanted)
    if at < 0:
        return None
    return numbers[bisect_right(offsets, at) - 1], numbers[bisect_right(offsets, at + len(wanted) - 1) - 1]


def _squeeze(text: str) -> str:
    """Text with each line's surrounding whitespace and blank lines removed."""
    return "\n".join(line.strip() for line in text.split("\n") if line.strip())
