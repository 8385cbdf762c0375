"""Calls whose JSON starts inside a line, after the model's words ("I will read it. {"name": ...}")."""

from __future__ import annotations

import re

from orchestrator import loose_json
from orchestrator.broken_calls import (
    MENDED_CALLS_TRIED,
    calls_in_unreadable_json,
    known_tool_named_at,
    unreadable_call_over_lines,
)
from orchestrator.call_shapes import WrittenCall, arguments_of, call_shapes
from orchestrator.json_block_calls import calls_in_block
from orchestrator.python_calls import calls_as_python
from orchestrator.strict_json import raw_decode

# A call's JSON after a sentence on the same line ("I will read it. {"name": ...}"), its key double- or
# single-quoted (`{'name': ...`, JSON5-like).
_INLINE_CALL_EITHER_QUOTE = re.compile(r"""\{\s*(["'])(?:name|tool|function)\1\s*:""")
# An array opened right before such a call, which the call is an item of: `[`, `{"tool_calls": [`.
_ARRAY_BEFORE_A_CALL = re.compile(r'(?:\{\s*"tool_calls"\s*:\s*)?\[\s*\Z')
_ARRAY_OPENING_LIMIT = 64  # how far before the call its array's opening is looked for: a bounded look, not back to the start


def _single_quoted_call_after_prose(
    text: str, start: int, exc: ValueError, known: set[str], tries_left: list[int], reads_left: int, *, whole_only: bool
) -> tuple[list[WrittenCall], int | None, int]:
    """The calls in the single-quoted call at `start` (after words on its line), where the text after them starts (None
    when it never closes), and how much of the text the look for its end read. One that closes, only words after it on
    its line up to the next call, is read to there as a block (see calls_in_block); one that never closes (it runs to
    the answer's end) is broken, cut off or unreadable, never run, as a double-quoted one is (see calls_after_prose);
    else it is read as one starting a line is (see calls_in_unreadable_json: repaired, broken or cut off), unless
    `whole_only` (it is inside one before it that never closes, already broken: only a whole call counts). Where a
    JSON5-like value closes is a guess (`'[{'id': 1}]\\n'` read as closing after `}]`): the words after it confirm it.
    While `reads_left` is spent the look is not made: each reads to the call's end, or the answer's, and a flood of calls
    that never close would take quadratic time."""
    read = 0
    if reads_left > 0:
        closed = loose_json.value_end(text, start)
        read = (closed if closed is not None else len(text)) - start
        if closed is None:  # inside one before it that never closes (`whole_only`), it is no call of its own to report
            return ([] if whole_only else unreadable_call_over_lines(text, start, exc, known)), None, read
        next_call = _INLINE_CALL_EITHER_QUOTE.search(text, closed)
        words_end = next_call.start() if next_call is not None else len(text)
        line_end = text.find("\n", closed, words_end)
        if loose_json.only_words(text[closed : line_end if line_end >= 0 else words_end]):
            calls = calls_in_block(text[start:closed], known, cut=False)
            if calls:
                return calls, closed, read
    if whole_only:
        return [], start, read
    calls, resume = calls_in_unreadable_json(text, start, exc, known, tries_left)
    return calls, resume, read


def calls_after_prose(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """Valid JSON calls of known tools that start inside a line, after some words.

    Only whole JSON naming a tool counts: prose that quotes some other JSON is not a call. In an answer cut at the
    length limit, a call is read with the array it is an item of (`[`, `{"tool_calls": [` before it), and the first
    JSON that does not read is read to the answer's end as a block is: a call in the value the limit cut is cut off,
    never run (its whole calls too, as at a line's start), nor dropped without a word. In an answer that ended as
    usual, the first call naming a known tool that does not read and never closes (it runs to the answer's end) is a
    broken call, cut off or unreadable (see unreadable_call_over_lines), never run: dropped, the model would be told
    it had called no tool. One that closes, though not as JSON (a quote inside a string not escaped: `"print("hi")"`),
    is read as a block, as on a line of its own (see calls_in_block): repaired, broken or cut off. So is a single-quoted
    one (`{'name': ...`, never JSON), or, where it closes is unsure, as one starting a line is (see
    _single_quoted_call_after_prose). A whole call after its start still runs; with none, calls written as Python lines
    (see calls_as_python) are the answer's calls instead, when it has any.
    """
    found: list[WrittenCall] = []
    resume = 0
    single_quoted_tries = [MENDED_CALLS_TRIED]  # as calls_in_bare_json's: each reads over lines at most so many times
    # What the looks for where a broken call closes may read in all, double- and single-quoted alike: each reads to the call's
    # end, or the answer's, so a flood of calls that never close, each looked at, would take time quadratic in its length.
    # One budget in characters, linear, lets as many looks as the calls are short (at least MENDED_CALLS_TRIED of them).
    reads_left = MENDED_CALLS_TRIED * len(text)
    cut_off: list[WrittenCall] = []
    for match in _INLINE_CALL_EITHER_QUOTE.finditer(text):
        if match.start() < resume:
            continue
        start = match.start()
        single_quoted = match.group(1) == "'"
        if single_quoted and known_tool_named_at(text, start, known) is None:
            continue  # some other JSON5-like value the model shows; unread (a failed read counts the lines before it)
        if cut:
            array = _ARRAY_BEFORE_A_CALL.search(text, max(resume, start - _ARRAY_OPENING_LIMIT), start)
            start = array.start() if array else start
        try:
            value, resume = raw_decode(text, start)
        except ValueError as exc:
            if cut:  # read once, not from each later call-like start: a flood of them would take quadratic time
                return found + calls_in_block(text[start:], known, cut)
            if single_quoted:
                calls, after, read = _single_quoted_call_after_prose(
                    text, start, exc, known, single_quoted_tries, reads_left, whole_only=bool(cut_off)
                )
                reads_left -= read
                if after is not None:
                    found.extend(calls)
                    resume = after
                elif not cut_off:  # it never closes: broken once, as a double-quoted one is; a whole call after its start runs
                    cut_off = calls
                    found.extend(cut_off)
                continue
            if not cut_off and reads_left > 0 and known_tool_named_at(text, start, known) is not None:
                closed = loose_json.value_end(text, start)
                reads_left -= (closed if closed is not None else len(text)) - start
                if closed is None:  # it runs to the answer's end: its last words are in it
                    cut_off = unreadable_call_over_lines(text, start, exc, known)
                    found.extend(cut_off)  # a whole call after its start (inside it, as read) still runs, as before
                elif calls := calls_in_block(text[start:closed], known, cut=False):
                    found.extend(calls)  # read as the same call on a line of its own is: repaired, broken or cut off
                    resume = closed
            continue
        shapes = call_shapes(value, known) or []
        found.extend(WrittenCall(name, arguments_of(arguments, "")) for name, arguments in shapes if name.strip() in known)
    if cut_off and len(found) == len(cut_off):
        # Only JSON that never closed, which may be the model's words showing a call's form: its calls written as Python
        # lines (`[read_file(path="a.py")]`) are the ones it made, as they were before such JSON was reported.
        return calls_as_python(text, known, cut) or found
    return found
