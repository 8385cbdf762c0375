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

Most searches are of a whole project, most of whose files hold no match: a
pattern that is plain text is looked for in a file's bytes first, and a file
without it is neither decoded nor split.
"""

from __future__ import annotations

import re
import string
import time
from dataclasses import dataclass

import regex

# A search of a project takes well under a second; one still matching after this long is backtracking.
SEARCH_TIMEOUT_S = 10.0
# A file's search begun just before that still gets this long: a pattern that outlasts it on one
# file (of at most 2 MB) is backtracking, not slow.
FILE_MIN_TIME_S = 1.0
# Escapes that match neither a line break nor anything across one (\b and \B see the break
# as a non-word character, as they see a line's start and end).
_ONE_LINE_ESCAPES = frozenset("dwSbB")
# regex unrolls a counted repeat's minimum when it compiles: (a{1000}){1000} took 0.5 s and 280 MB,
# ((((a{50}){50}){50}){50}) 7 s and 1.9 GB, a{4000000000} had not finished after 20 s, all before the
# search's time limit starts. 100,000 copies compile in about 0.1 s; a range's rest ({1,1000000}) is not unrolled.
MOST_UNROLLED_COPIES = 100_000
# Characters that make a pattern more than plain text (`regex` without VERBOSE).
_SPECIAL = frozenset(".^$*+?{}[]\\|()")
# Escaped, each of these is itself, as regex.escape writes them (a pattern that does not compile is searched so).
_ESCAPED_LITERALS = frozenset(string.punctuation + " ")
# A counted repeat: {n}, {m,}, {m,n}, {,n}.
_COUNTED_REPEAT = re.compile(r"\{(\d*)(?:,(\d*))?\}")
# Escapes whose argument is in braces: \p{L}, \N{name}, \x{41}, \g{name}.
_BRACED_ESCAPES = frozenset("pPNxuUg")


class PatternTooBig(ValueError):
    """Compiling the pattern would take far longer, and far more memory, than any search."""


@dataclass(frozen=True)
class Matcher:
    """A search's pattern, and what is judged of it once a search instead of once a file."""

    pattern: regex.Pattern[str]
    whole_text: bool
    # The UTF-8 bytes every match is, when the pattern is plain text; else None.
    literal: bytes | None

    @classmethod
    def of(cls, pattern: regex.Pattern[str]) -> Matcher:
        return cls(pattern, stays_on_one_line(pattern.pattern), _literal_bytes(pattern.pattern))

    def lines_in(self, data: bytes, limit: int, deadline: float) -> list[tuple[int, str]]:
        """(line number from 1, line) for the first `limit` matching lines of a file's bytes, decoded as UTF-8.

        Raises TimeoutError once `deadline` (time.monotonic()) has passed.
        """
        if self.literal is not None and self.literal not in data:
            return []  # a matching line of the decoded text is a run of the file's bytes
        return self.lines_of_text(data.decode("utf-8", errors="replace"), limit, deadline)

    def lines_of_text(self, text: str, limit: int, deadline: float) -> list[tuple[int, str]]:
        """(line number from 1, line) for the first `limit` matching lines of `text`; TimeoutError past `deadline`."""
        if self.whole_text:
            return _by_whole_text(text, self.pattern, limit, deadline)
        return _line_by_line(lines_of(text), self.pattern, limit, deadline)


def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """`pattern` as a regular expression; a pattern that is not one is the plain text the model meant.

    Raises PatternTooBig for a pattern whose counted repeats unroll to more than MOST_UNROLLED_COPIES.
    """
    if unrolled_copies(pattern) > MOST_UNROLLED_COPIES:
        raise PatternTooBig(pattern)
    # Not kept in regex's cache of the last 500 patterns compiled: a search compiles its pattern once, and the
    # largest the bound lets through keep 75 MB each there (8 such searches held 650 MB for the whole night).
    try:
        return regex.compile(pattern, regex.MULTILINE, cache_pattern=False)
    # ValueError: regex's own parser fails so on some text it takes for fuzzy matching (`{9s<`), which
    # raised out of the tool and ended the iteration as iteration_error.
    except (regex.error, ValueError, OverflowError, RecursionError):
        return regex.compile(regex.escape(pattern), regex.MULTILINE, cache_pattern=False)


def _line_by_line(lines: list[str], pattern: regex.Pattern[str], limit: int, deadline: float) -> list[tuple[int, str]]:
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


def _by_whole_text(text: str, pattern: regex.Pattern[str], limit: int, deadline: float) -> list[tuple[int, str]]:
    # The text of lines_of(text) joined with "\n" only, so that `$` and `^` (MULTILINE) meet the same
    # line ends as the lines alone; without splitting it, as most files hold no match.
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if not text:
        return []  # no lines
    if text.endswith("\n"):
        text = text[:-1]  # the end of the last line, not an empty line after it
    found: list[tuple[int, str]] = []
    line, scanned = 0, 0
    for match in pattern.finditer(text, timeout=_left(deadline), concurrent=True):
        line += text.count("\n", scanned, match.start())
        scanned = match.start()
        if not found or found[-1][0] != line + 1:
            start = text.rfind("\n", 0, scanned) + 1
            end = text.find("\n", scanned)
            found.append((line + 1, text[start:] if end < 0 else text[start:end]))
            if len(found) >= limit:
                break
    return found


def _literal_bytes(source: str) -> bytes | None:
    """The UTF-8 bytes of the text `source` matches, when it is plain text (special characters
    escaped at most); None otherwise, or when it holds "\ufffd", which also matches bytes that are not UTF-8."""
    chars: list[str] = []
    escaped = False
    for char in source:
        if escaped:
            if char not in _ESCAPED_LITERALS:
                return None  # \d, \n, \1 and the like
            chars.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in _SPECIAL:
            return None
        else:
            chars.append(char)
    text = "".join(chars)
    if escaped or "\ufffd" in text:
        return None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which no decoded text holds
        return None


def unrolled_copies(source: str) -> int:
    """About how many items compiling `source` makes: a counted repeat's minimum is unrolled, so
    (a{1000}){1000} makes a million (erring towards more: alternatives are added up)."""
    frames = [[0, 0]]  # for each open group: [items so far, items of the last one]
    at = 0
    while at < len(source):
        char = source[at]
        repeat = _COUNTED_REPEAT.match(source, at) if char == "{" else None
        if repeat:
            # Twelve digits are past any bound, and int() refuses over 4,300 of them.
            times = max(int(repeat.group(1).lstrip("0")[:12] or 0), 1)
            frame = frames[-1]
            frame[0] += frame[1] * (times - 1)
            frame[1] *= times
            at = repeat.end()
            continue
        if char == "(":
            frames.append([0, 0])
        elif char == ")" and len(frames) > 1:
            size = max(frames.pop()[0], 1)
            frames[-1][0] += size
            frames[-1][1] = size
        elif char == "|":
            frames[-1][1] = 0  # a count right after it repeats nothing
        elif char not in "*+?":  # these repeat without unrolling
            at = _end_of_item(source, at)
            frames[-1][0] += 1
            frames[-1][1] = 1
            continue
        at += 1
    return sum(frame[0] for frame in frames)


def _end_of_item(source: str, at: int) -> int:
    """Where the single item (a character, an escape, a set) starting at `at` ends."""
    if source[at] == "\\":
        if at + 2 < len(source) and source[at + 1] in _BRACED_ESCAPES and source[at + 2] == "{":
            close = source.find("}", at + 2)
            return len(source) if close < 0 else close + 1
        return at + 2
    if source[at] == "[":
        scan = at + 1
        if scan < len(source) and source[scan] == "^":
            scan += 1
        if scan < len(source) and source[scan] == "]":
            scan += 1  # a "]" first in a set is the character
        while scan < len(source) and source[scan] != "]":
            scan += 2 if source[scan] == "\\" else 1
        return scan + 1
    return at + 1


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left
