"""Text read by the repair library (json_repair), asked only for what strict and mended JSON could not read.

The library strips the white space that ends a string in a line break (a file's last newline), which is put back
here; and it is quadratic on some texts, so it reads on a budget of characters, past which the text is unreadable.
Its value is refused, as strict JSON's is, when nested deeper than MAX_JSON_DEPTH (orchestrator/strict_json.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.strict_json import MAX_JSON_DEPTH, nested_deeper_than
from orchestrator.surrogates import mend_all


def repair(text: str) -> Any:
    """`text`'s value as the repair library reads it, each string keeping the white space that ends it (see
    _with_ends_kept), or None when the library cannot read it, or not on a budget (see _ReadOnABudget)."""
    repaired = _library_repair(_ReadOnABudget(text))
    if repaired is None:
        return None
    return mend_all(_with_ends_kept(text, repaired))


def _library_repair(text: str) -> Any:
    """`text`'s value as the repair library reads it; None when it cannot, or reads past a _ReadOnABudget's budget."""
    try:
        import json_repair

        repaired = json_repair.loads(text)
    except Exception:  # the repair library fails in its own ways on garbage (RecursionError too); garbage stays unparseable
        return None
    return None if nested_deeper_than(repaired, MAX_JSON_DEPTH) else repaired


def _with_ends_kept(text: str, repaired: Any) -> Any:
    """`repaired` with the white space back that the repair library strips from a string ending in a line break (a
    file's last newline, its blank lines and indentation after). A mark is written after each line break before a
    quote that may close a string, so the library reads it as the string's last character and strips nothing; kept
    only when, the marks taken out and those strings stripped as the library does, the reading is `repaired`
    itself: else a mark changed how the text was read, or stood elsewhere than at a string's end. Keys stay as the
    library reads them (a key's line break is no file's). The marked text is read on a budget (see _ReadOnABudget)."""
    marked_text = _LINE_BREAK_BEFORE_A_CLOSING_QUOTE.sub(r"\1" + _END_MARK, text)
    if marked_text == text or _END_MARK in text:
        return repaired
    marked = _library_repair(_ReadOnABudget(marked_text))
    if marked is None or json.dumps(_ends_changed(marked, _stripped)) != json.dumps(repaired):
        return repaired
    return _ends_changed(marked, _unmarked)


# Written where a string's white space ends in a line break before its closing quote: a character no model writes
# (private use), which the repair library keeps as the string's last, not white space it strips.
_END_MARK = "\ue000"
# A quote after a line break (raw or the escape `\n`, not `\\n`, a backslash then n: `printf("%d\\n", x)`), then what may
# follow a value: a comma, a closing bracket, the end. (An even run of backslashes before the escape is escapes of their own.)
_LINE_BREAK_BEFORE_A_CLOSING_QUOTE = re.compile(r"""(\n|(?<!\\)(?:\\\\)*\\n)(?=['"]\s*(?:[,}\]]|\Z))""")
# The characters the repair library may read of a text (a slice counts its length): a long text it reads at once is read
# 2 to 4 times per character (a short one up to 11 times, a few hundred reads), one it goes quadratic on thousands of times.
_READS_PER_CHARACTER = 8
_READS_AT_LEAST = 1024


class _ReadOnABudget(str):
    """A text the repair library may read only so much of (see _READS_PER_CHARACTER), one character or slice at a time
    by index, as it does; past that its reading stops with _OverBudget. The library is quadratic on a string holding
    many quotes it reads as the string's own (each scanned to the end): a 20 kB answer of `{'` took 11 s of CPU, with
    every task's thread waiting on the GIL meanwhile, and gave no call worth running. Such a text is unreadable (a
    broken call); a marked one keeps its first reading (marks turn some texts the library read at once into such
    strings: `['}\\n'` repeated, 20 kB, read in 7 ms, marked in 4 s). No text of the corpora that model outputs were
    measured on (68,809 generated calls, 3 to 40 kB writes among them, and 30,000 mutated ones) reads otherwise."""

    def __new__(cls, text: str) -> _ReadOnABudget:
        budgeted = super().__new__(cls, text)
        budgeted.reads_left = _READS_PER_CHARACTER * len(text) + _READS_AT_LEAST
        return budgeted

    def __getitem__(self, index: Any) -> str:
        read = str.__getitem__(self, index)
        self.reads_left -= max(1, len(read))
        if self.reads_left < 0:
            raise _OverBudget
        return read


class _OverBudget(Exception):
    """The repair library read more of a text than its budget (not one of the errors the library catches)."""


class _MisplacedMark(Exception):
    """A mark read elsewhere than as a string's last character: it changed where the library ended a string."""


def _ends_changed(value: Any, change: Any) -> Any:
    """`value` with `change` made to each of its strings, and its keys read as the library reads them unmarked (a key
    it takes from a value's end, `'"it's\\n",`, is named `'s'` as before); a misplaced mark makes it None."""
    try:
        return _each_string_changed(value, change)
    except _MisplacedMark:
        return None


def _each_string_changed(value: Any, change: Any) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {_stripped(key) if isinstance(key, str) else key: _each_string_changed(item, change) for key, item in value.items()}
    if isinstance(value, list):
        return [_each_string_changed(item, change) for item in value]
    return value


def _stripped(string: str) -> str:
    """`string` as the repair library reads it unmarked: one marked after a line break loses its trailing white space."""
    unmarked = _unmarked(string)
    return unmarked.rstrip() if string.endswith("\n" + _END_MARK) else unmarked


def _unmarked(string: str) -> str:
    """`string` without its mark, which may only be its last character (after a line break, or after an escaped
    backslash's `n`, `\\n`, which the mark's place cannot tell apart)."""
    if _END_MARK not in string:
        return string
    if string.find(_END_MARK) != len(string) - 1:
        raise _MisplacedMark(string)
    return string[:-1]
