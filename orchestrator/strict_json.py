"""Read strict JSON (raw line breaks inside strings allowed) into a value nested no deeper than MAX_JSON_DEPTH.

Deeper JSON is refused as unreadable (a ValueError, like any other), never met by a RecursionError; half a surrogate
pair that a \\u escape made is mended (orchestrator/surrogates.py). A value that starts a long text is read from a window
of the text after it, so that a flood of call-like starts that never close costs time linear in the answer's length.
This module knows no slip, no repair and no call: the readers of a call's arguments and of calls written in the text
ask it first.
"""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.surrogates import mend_all

# strict=False: a raw newline inside a string is unambiguous, and small models write them.
_DECODER = json.JSONDecoder(strict=False)
# Arguments never need more; deeper JSON is refused as unparseable rather than met by a RecursionError.
MAX_JSON_DEPTH = 64


def loads(text: str) -> Any:
    """All of `text` as one JSON value (see raw_decode)."""
    return raw_decode(text, 0, whole=True)[0]


def raw_decode(text: str, start: int, *, whole: bool = False) -> tuple[Any, int]:
    """The JSON value at `start` (or, if `whole`, all of `text`), with JSON nested too deeply to read or
    to use (json's recursion, our guards' own) refused as a ValueError, like any other unreadable JSON."""
    try:
        value, end = (_DECODER.decode(text), len(text)) if whole else _value_at(text, start)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    if nested_deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    # Only a \u escape in the JSON can have made half a surrogate pair (see orchestrator/surrogates.py).
    return (mend_all(value) if text.find("\\u", start, end) >= 0 else value), end


# A flood of call-like starts (`{"name": {"name": ...`, `{"name":} {"name":} ...`), each read, would take time quadratic
# in the answer's length: json's error counts the line breaks before its place from the text's start, and a value that
# never closes is read to the text's end, or, nested, to the interpreter's recursion limit (1,000 levels on Python 3.11,
# 10,000 on 3.13) before it is refused. So a start's value is first read from a window of the text after it; only a
# reading that the window's end may have changed is read again from the whole text, and not when the value opens more
# levels than MAX_JSON_DEPTH allows, which reading would refuse.
_WINDOW = 2048
# Longer than any token the window's end may cut where json then places its error before that end (`-Infinity`, `tru`,
# `\uD83D\uDE0`); a string the window's end cuts is said to be unterminated at its start, anywhere.
_WINDOW_MARGIN = 64


def _value_at(text: str, start: int) -> tuple[Any, int]:
    """json's raw_decode of the value at `start`, read from a window of the text when that is as good as the whole."""
    if len(text) - start <= _WINDOW:
        return _DECODER.raw_decode(text, start)
    if _OPENS_TOO_DEEP_AT_ONCE.match(text, start):  # a flood's start: refused before any reading
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    window = text[start : start + _WINDOW]
    try:
        value, end = _DECODER.raw_decode(window, 0)
    except json.JSONDecodeError as exc:
        if exc.pos < _WINDOW - _WINDOW_MARGIN and not exc.msg.startswith("Unterminated string"):
            raise _PlacedDecodeError(exc.msg, text, start + exc.pos) from None
    else:
        if end < _WINDOW - _WINDOW_MARGIN:
            return value, start + end
    if _opens_too_deep(text, start):
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    return _DECODER.raw_decode(text, start)


# A bracket, or a string read whole (to its first unescaped quote, or the text's end): what JSON's nesting is made of.
_BRACKET_OR_STRING = re.compile(r'[{}\[\]]|"(?:[^"\\]|\\.)*+"?', re.DOTALL)
# A value that opens more levels than MAX_JSON_DEPTH allows before it closes any (`{"name": {"name": ...`, `[{"a": 1, "b": [`),
# matched at once: the openings of objects (members whose values are scalars, then the key of the next) and arrays (scalars).
_SPACE = r"[ \t\n\r]*+"  # JSON's white space
# JSON's own strings and scalars only (not `x`, `1abc`, `"\\x"`): a text that matches reads as JSON up to where it opens too
# deep, so the reading it saves would have refused it too, or stopped at an error after that place.
_STRING = r'"(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+"'
_NUMBER = r"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?"
_SCALAR = rf"(?:{_STRING}|{_NUMBER}|true|false|null|NaN|-?Infinity)"
_KEY = rf"{_STRING}{_SPACE}:{_SPACE}"
_OPENING = rf"(?:\{{{_SPACE}{_KEY}(?:{_SCALAR}{_SPACE},{_SPACE}{_KEY})*+|\[{_SPACE}(?:{_SCALAR}{_SPACE},{_SPACE})*+)"
_OPENS_TOO_DEEP_AT_ONCE = re.compile(rf"{_OPENING}{{{MAX_JSON_DEPTH + 2}}}", re.DOTALL)  # as _opens_too_deep counts


def _opens_too_deep(text: str, start: int) -> bool:
    """Whether the value at `start` opens a container at a level deeper than MAX_JSON_DEPTH allows (see nested_deeper_than)
    before it closes: read whole, it would be refused. Its strings are skipped whole, as in JSON every quote outside one
    starts one; the look ends there, or where the value closes."""
    if not text.startswith(("{", "["), start):
        return False
    depth = 0
    for token in _BRACKET_OR_STRING.finditer(text, start):
        char = text[token.start()]
        if char in "{[":
            depth += 1
            if depth > MAX_JSON_DEPTH + 1:
                return _reads_up_to(text, start, token.start())
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return False
    return False


def _reads_up_to(text: str, start: int, opening: int) -> bool:
    """Whether json reads the value at `start` without an error before `opening`, the bracket found too deep: the brackets
    counted after an error (`[` then 2,000 spaces, `1 [[[...`) are no nesting json ever reaches; it refuses the text there."""
    try:
        _DECODER.raw_decode(text[start : opening + 1])
    except json.JSONDecodeError as exc:
        return exc.pos > opening - start
    return False


class _PlacedDecodeError(json.JSONDecodeError):
    """json's error at its place in the whole text, its line and column counted only when asked for."""

    def __init__(self, msg: str, doc: str, pos: int) -> None:  # not json's, which counts them at once
        ValueError.__init__(self, msg)
        self.msg, self.doc, self.pos = msg, doc, pos

    @property  # type: ignore[override]
    def lineno(self) -> int:
        return self.doc.count("\n", 0, self.pos) + 1

    @property  # type: ignore[override]
    def colno(self) -> int:
        return self.pos - self.doc.rfind("\n", 0, self.pos)

    def __str__(self) -> str:
        return f"{self.msg}: line {self.lineno} column {self.colno} (char {self.pos})"


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` holds an item, a container or a scalar, more than `limit` levels inside it."""
    level = [value]
    for _ in range(limit + 1):
        level = [item for node in level if isinstance(node, (dict, list)) for item in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return False
    return True


def json_error(exc: ValueError, start: int = 0) -> str:
    """The error's message, its place counted from `start`, where the JSON began."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at char {exc.pos - start}"
    return str(exc)
