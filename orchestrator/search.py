"""The lines of a text that match a pattern, within a time limit: the `search` tool's engine.

A model's pattern can backtrack without end, like `(a+)+$` on a long line. With
`re` such a search never returns, and since it holds the GIL, it would freeze
every task of the night, the watchdogs and the signal handlers with it. The
`regex` library takes a time limit and lets go of the GIL while it matches.

Its time limit costs about 2 µs a call, ten times a short line's match. So a
pattern that can neither match a line break nor look past one is run once
over the whole text, which finds exactly the lines that a line-by-line search
finds; any other pattern (lookarounds, `\\s`, `[^...]`, inline flags...) is
run on each line.
"""

from __future__ import annotations

import time

import regex

# A search of a project takes well under a second; one still matching after this long is backtracking.
SEARCH_TIMEOUT_S = 10.0
# A file's search begun just before that still gets this long: a pattern that outlasts it on one
# file (of at most 2 MB) is backtracking, not slow.
FILE_MIN_TIME_S = 1.0
# Escapes that match neither a line break nor anything across one (\b and \B see the break
# as a non-word character, as they see a line's start and end).
_ONE_LINE_ESCAPES = frozenset("dwSbB")


def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """`pattern` as a regular expression; a pattern that is not one is the plain text the model meant."""
    try:
        return regex.compile(pattern, regex.MULTILINE)
    # ValueError: regex's own parser fails so on some text it takes for fuzzy matching (`{9s<`), which
    # raised out of the tool and ended the iteration as iteration_error.
    except (regex.error, ValueError, OverflowError, RecursionError):
        return regex.compile(regex.escape(pattern), regex.MULTILINE)


def matching_lines(text: str, pattern: regex.Pattern[str], limit: int, deadline: float) -> list[tuple[int, str]]:
    """(line number from 1, line) for the first `limit` lines of `text` that `pattern` matches.

    Raises TimeoutError once `deadline` (time.monotonic()) has passed.
    """
    lines = lines_of(text)
    if not lines:
        return []
    if stays_on_one_line(pattern.pattern):
        return _by_whole_text(lines, pattern, limit, deadline)
    found: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        if pattern.search(line, timeout=_left(deadline), concurrent=True):
            found.append((number, line))
            if len(found) >= limit:
                break
    return found


def lines_of(text: str) -> list[str]:
    """The lines of `text`, without their line ends, split at "\\n" only: as editors, grep and
    read_file count them (str.splitlines also splits at \\x0c, \\x85, \\u2028 and more, which
    put every later line number off)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the end of the last line, not an empty line after it
    return lines


def stays_on_one_line(source: str) -> bool:
    """Whether a pattern can neither match a line break nor look past one (judged from its text, erring towards no)."""
    if "\n" in source or "(?" in source or "[^" in source or "[:" in source:
        return False
    escaped = False
    for char in source:
        if escaped:
            if char.isalnum() and char not in _ONE_LINE_ESCAPES:
                return False  # \s, \n, \x0a, \p{..}, \A, \Z, back-references and the like
            escaped = False
        elif char == "\\":
            escaped = True
    return True


def _by_whole_text(lines: list[str], pattern: regex.Pattern[str], limit: int, deadline: float) -> list[tuple[int, str]]:
    # Joined with "\n" only, so that `$` and `^` (MULTILINE) meet the same line ends as the lines alone.
    text = "\n".join(lines)
    numbers: list[int] = []
    line, scanned = 0, 0
    for match in pattern.finditer(text, timeout=_left(deadline), concurrent=True):
        line += text.count("\n", scanned, match.start())
        scanned = match.start()
        if not numbers or numbers[-1] != line:
            numbers.append(line)
            if len(numbers) >= limit:
                break
    return [(number + 1, lines[number]) for number in numbers]


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left
