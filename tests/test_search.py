"""The search tool's engine: the whole-text way finds exactly the lines the line-by-line way finds."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from orchestrator.search import (
    MOST_UNROLLED_COPIES, Matcher, PatternTooBig, compile_pattern, lines_of, stays_on_one_line, unrolled_copies,
)

TEXTS = [
    "alpha\nbeta gamma\ngamma\n",
    "first line\r\nsecond  line\r\n\r\nlast",  # Windows line ends and an empty line
    "x = 1\n\n\ny = 22\nz=333",
    "tab\there\u2028unicode line break\x0bvertical tab\x85next line\x0cform feed",  # not line breaks here
    "",
    "\n\n",
    "word\nsword\nwords and swords\n",
    "def f():\n    return a - b\n\ndef g():\n    pass\n",
]
PATTERNS = [
    "gamma", "^gamma$", "^$", "line$", "^s", r"\d+", r"\w+ \w+", r"\bword\b", r"\Bword", "a.*a", "x*", ".",
    "return a - b", "def .*\\(", r"[a-c]+", r"\S+$", "e\\.", "(ab|cd)+",
]


def line_by_line(text: str, pattern: str) -> list[tuple[int, str]]:
    compiled = compile_pattern(pattern)
    return [(n, line) for n, line in enumerate(lines_of(text), start=1) if compiled.search(line)]


def lines_of_text(text: str, pattern: str, limit: int, deadline: float) -> list[tuple[int, str]]:
    """What the search tool's Matcher finds in `text` for `pattern` (the tool compiles it so)."""
    return Matcher.of(compile_pattern(pattern)).lines_of_text(text, limit, deadline)


class TestFindingLines:
    @pytest.mark.parametrize("pattern", PATTERNS)
    def test_whole_text_finds_what_each_line_finds(self, pattern):
        """For every pattern taken the fast way, the lines found are those of a search line by line."""
        assert stays_on_one_line(pattern), pattern
        for text in TEXTS:
            assert lines_of_text(text, pattern, 1000, time.monotonic() + 10) == line_by_line(text, pattern), (pattern, text)

    @pytest.mark.parametrize(
        "pattern",
        [r"a\sb", r"gamma\n", "[^x]+", "(?s)a.b", "(?<=a)b", r"\Agamma", r"gamma\Z", r"(a)\1", r"\x0a", r"\p{L}", "[[:space:]]", "a\nb"],
    )
    def test_patterns_that_may_cross_a_line_go_line_by_line(self, pattern):
        """A pattern that can match a line break or look past one is judged line by line, with the same result."""
        assert not stays_on_one_line(pattern)
        for text in TEXTS:
            assert lines_of_text(text, pattern, 1000, time.monotonic() + 10) == line_by_line(text, pattern)

    def test_limit_counts_lines_not_matches(self):
        """Several matches on one line count once; the search stops at `limit` lines."""
        text = "a a a\nb\na\na\n"
        assert lines_of_text(text, "a", 2, time.monotonic() + 10) == [(1, "a a a"), (3, "a")]

    @pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a+)+\s$"])
    def test_deadline_stops_a_backtracking_pattern(self, pattern):
        """Either way, a pattern that backtracks without end raises TimeoutError at the deadline."""
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            lines_of_text("ok\n" + "a" * 5000 + "!\n", pattern, 10, started + 0.5)
        assert time.monotonic() - started < 3

    def test_not_a_regex_is_plain_text(self):
        """A pattern that does not compile is searched as the plain text it is."""
        assert lines_of_text("call(a, b\n", "call(a", 10, time.monotonic() + 10) == [(1, "call(a, b")]

    def test_line_numbers_count_line_feeds_only(self):
        """A form feed, \\x85 or \\u2028 inside a line does not put the later line numbers off, as str.splitlines did."""
        text = "a = 1\n\x0cdef target():\r\n    s = 'a\u2028b\x85c'\ntarget()\n"
        found = lines_of_text(text, "target", 10, time.monotonic() + 10)
        assert found == [(2, "\x0cdef target():"), (4, "target()")]
        assert lines_of("a\r\nb\n\nc") == ["a", "b", "", "c"] and lines_of("") == [] and lines_of("\n") == [""]


# Plain text, some of it escaped, and what it is in bytes; and patterns that are more than plain text.
LITERALS = {"gamma": b"gamma", "return a - b": b"return a - b", r"e\.": b"e.", r"def f\(\)": b"def f()", "call(a": b"call(a", "x\\": b"x\\"}
NOT_LITERALS = ["a.b", r"\d", "^x", "x$", "(?i)x", "a|b", "\ufffd", "caf\ufffd"]


class TestMatcher:
    @pytest.mark.parametrize("pattern", PATTERNS + list(LITERALS) + ["\ufffd", "line\r", "(?i)GAMMA", r"\s\w"])
    def test_a_files_bytes_give_the_lines_its_text_gives(self, pattern):
        """Looked for in a file's bytes (plain text first in the bytes, then decoded), a pattern finds the lines a search of the decoded text line by line finds, bytes that are not UTF-8 included."""
        matcher = Matcher.of(compile_pattern(pattern))
        for data in [text.encode() for text in TEXTS] + [b"caf\xe9 gamma\n\xff\xfe line\r\nreturn a - b\n"]:
            text = data.decode("utf-8", errors="replace")
            assert matcher.lines_in(data, 1000, time.monotonic() + 10) == line_by_line(text, pattern), (pattern, data)

    def test_only_plain_text_is_looked_for_in_the_bytes(self):
        """Plain text (special characters escaped at most) is what is looked for in the bytes; a pattern that is more, or that holds \ufffd (which bytes not UTF-8 decode to), is not."""
        assert {pattern: Matcher.of(compile_pattern(pattern)).literal for pattern in LITERALS} == LITERALS
        assert [pattern for pattern in NOT_LITERALS if Matcher.of(compile_pattern(pattern)).literal is not None] == []


class TestCompileBound:
    @pytest.mark.parametrize("pattern", ["(a{1000}){1000}", "((((a{50}){50}){50}){50})", "a{4000000000}", "(?:ab){100000}", "(x|y{1000}){1000}", "a{" + "9" * 5000 + "}"])
    def test_a_pattern_whose_repeats_unroll_to_millions_is_refused_before_compiling(self, pattern):
        """Counted repeats that the compiler would unroll past the bound (seconds and gigabytes before any time limit) raise PatternTooBig at once."""
        started = time.monotonic()
        with pytest.raises(PatternTooBig):
            compile_pattern(pattern)
        assert time.monotonic() - started < 0.1

    @pytest.mark.parametrize(
        "pattern", [r"\d{4}-\d{2}", r"[a-f0-9]{40}", "x{1,1000000}", "(ab){2,}", r"\p{L}{3}", "[{]{5}", "{9s<~~W", "a{65535}", r"\{1000000\}"]
    )
    def test_patterns_with_small_or_ranged_repeats_compile(self, pattern):
        """Repeats a model writes, a range (which is not unrolled), and braces that are no repeat are under the bound and compile."""
        assert unrolled_copies(pattern) <= MOST_UNROLLED_COPIES
        compile_pattern(pattern)

    @pytest.mark.parametrize("pattern", [r"(?fi)(\X{316}){315}", "not a (pattern"])
    def test_a_compiled_pattern_is_freed_once_its_search_drops_it(self, pattern):
        """A search's compiled pattern (the largest under the bound hold 75 MB) is not kept after the search, in regex's cache of 500 patterns or anywhere else."""
        compiled = compile_pattern(pattern)
        freed = weakref.ref(compiled)
        del compiled
        gc.collect()
        assert freed() is None

    def test_nested_repeats_multiply(self):
        """A group's count multiplies what its items unroll to, as the compiler does."""
        assert unrolled_copies("(a{1000}){1000}") == 1_000_000 and unrolled_copies("(?:ab){3}c") >= 7
