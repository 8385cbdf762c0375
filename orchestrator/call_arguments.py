"""Read the JSON text a model wrote for a call's arguments (or a whole call) into a value.

Small models write JSON with slips: a regex's `\\d` as is, a trailing comma, single
quotes and bare keys, closing brackets missing, two objects run together, or an answer
that stops mid-value. Strict JSON is read first; then the slips are mended, a JSON5-like
value is read loosely (orchestrator/loose_json.py), and the repair library reads the
rest, on a budget. Text that stops inside a string or where a value was due is cut off,
never repaired: run, it would be half of what was meant. A reading keeps its JSON error
and the key a loose reading named twice, so that the call can be reported as broken and
the model told why. JSON nested deeper than MAX_JSON_DEPTH is unreadable. This module
knows no call's form and no tool: orchestrator/toolcalls.py and the readers of calls
written in the text (orchestrator/written_calls.py's forms) ask it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from orchestrator import loose_json
from orchestrator.loose_json import BETWEEN_VALUES
from orchestrator.surrogates import mend_all

# What is wrong with a call in an answer cut at the length limit: it is never run, nor repaired.
CUT_OFF = "cut off at the length limit"
# strict=False: a raw newline inside a string is unambiguous, and small models write them.
_DECODER = json.JSONDecoder(strict=False)
# Arguments never need more; deeper JSON is refused as unparseable rather than met by a RecursionError.
MAX_JSON_DEPTH = 64


@dataclass(frozen=True)
class Arguments:
    """Arguments as read: the value, and the JSON error if it only parsed after repair, and whether that error
    says the text ends in the middle of a value (see text_ends_mid_value), and the key that the loose reading or the
    repair named twice in one object ("" for none: see loose_json.repeated_key), and whether the object closed before
    the text's end, more than words following it (see closes_early)."""

    value: Any
    raw: str
    json_error: str = ""
    ends_mid_value: bool = False
    repeated_key: str = ""
    closes_early: bool = False


def read_arguments(text: str) -> Arguments:
    """Parse arguments JSON; if it is not valid, keep the repaired value and the error. Arguments cut off mid-value
    are never run, so they are not repaired: the repair library is quadratic on some garbage (64 kB of `{'` took
    minutes), and what it would make of them is thrown away."""
    if not text.strip():
        return Arguments({}, text)
    try:
        return Arguments(loads(text), text)
    except ValueError as exc:
        if text_ends_mid_value(exc, text):
            return Arguments(None, text, json_error(exc), ends_mid_value=True)
        if closes_early(text):
            return Arguments(None, text, json_error(exc), closes_early=True)
        value, repeated = read_repaired(text)
        return Arguments(value, text, json_error(exc), repeated_key=repeated)


def text_ends_mid_value(exc: ValueError, text: str) -> bool:
    """Whether `text`, whose JSON failed with `exc`, stops inside a string or where a value was due: cut off, though not at
    the length limit (a server's own cap, a model that stopped). Repaired, its last value would be half of
    what was meant, or one the repair made up (`"new": ` read as `""`, an edit that deletes), and run as such.
    One that lacks only its closing brackets, every value whole, is a slip the repair may mend."""
    if not isinstance(exc, json.JSONDecodeError):
        return False
    if _stops_mid_value(exc, text):
        return True
    # The error may be a slip the repair mends first (a regex's `\d`, a trailing comma), before where the text stops.
    mended = slips_mended(text)
    if mended != text:
        try:
            loads(mended)
        except json.JSONDecodeError as after_mending:
            if _stops_mid_value(after_mending, mended):
                return True
        except ValueError:
            return False
        else:
            return False  # whole once mended: a slip only
    # Or its quoting, in JSON5-like text, or the objects after the first (JSON's own error is "Extra data" then).
    return loose_json.stops_mid_value(text)


def _stops_mid_value(exc: json.JSONDecodeError, text: str) -> bool:
    if exc.msg.startswith("Unterminated string"):
        return True
    rest = text[exc.pos :].rstrip()
    if exc.msg.startswith("Invalid \\uXXXX escape"):
        return len(rest) < 6 and '"' not in rest  # `\u12`: the text ends inside the escape, so inside its string
    if exc.msg == "Expecting value":
        # Nothing where a value was due, or the start of a literal or a number's sign (`tru`, `-`) and nothing after.
        return not rest or rest == "-" or any(word.startswith(rest) for word in ("true", "false", "null"))
    return exc.msg == "Expecting ':' delimiter" and not rest


def closes_early(text: str) -> bool:
    """Whether `text`, a call's arguments alone, holds a first object or array that reads (as JSON, or JSON5-like with no
    quote in its strings: see _json5_like_value_at) and closes before the text's end, followed by more than the model's
    words (see loose_json.only_words), stray closing brackets, or further values (calls run together): a quote inside its
    content, not escaped, taken for a string's end, before a bracket (`"content": "s = "}"; t = 1"}`). Repaired, it ran
    with its content cut at that quote, the rest of the text dropped. A JSON5-like reading whose strings hold a quote
    (`'d = {1: 'a', 2: 'b'}'}` read as closing after `'b'`) already guessed where they end: the repair reads it whole."""
    start = len(text) - len(text.lstrip())
    try:
        _, end = raw_decode(text, start)
    except ValueError:
        read = _json5_like_value_at(text, start)
        if read is None or _holds_a_quote(read[0]):
            return False
        end = read[1]
    rest = text[BETWEEN_VALUES.match(text, end).end() :]  # type: ignore[union-attr]
    return not rest.startswith(("{", "[")) and bool(rest.strip("}], \t\r\n")) and not loose_json.only_words(rest)


def _holds_a_quote(value: Any) -> bool:
    if isinstance(value, str):
        return "'" in value or '"' in value
    if isinstance(value, dict):
        return any(_holds_a_quote(key) or _holds_a_quote(item) for key, item in value.items())
    return isinstance(value, list) and any(_holds_a_quote(item) for item in value)


def read_repaired(text: str) -> tuple[Any, str]:
    """`text`'s value after repair, and the key its reading names twice (see loose_json.repeated_key; "" when mended to
    strict JSON, which keeps the last): first of the two slips small models make most (a backslash JSON does
    not know: a regex's `\\d` written as is; a comma before a closing bracket) mended exactly; then, when
    `text` is one JSON5-like object or array (single quotes, bare keys, the model's words after it, closing
    brackets missing though every value is whole), that value read loosely; the repair library only for the
    rest, since it reads an apostrophe inside a single-quoted string (`'it's done'`) as its end (and strips the
    line breaks that end a string, which repair puts back)."""
    mended = slips_mended(text)
    if mended != text:
        try:
            return loads(mended), ""
        except ValueError:
            pass
    loose = read_loosely(text)
    return (loose if loose is not None else _every_object_kept(text, repair(text))), loose_json.repeated_key(text)


def _every_object_kept(text: str, repaired: Any) -> Any:
    """`repaired`, or, when the repair library read `text` as objects one after another (calls run together, a quote in
    their content not escaped) and kept only the last, all of them in a list: at its top level the library takes an object
    with the same keys as the one before for an update of it, and drops that one (a write lost). Read as an array's items,
    none is dropped; that reading counts only when its last item is the object kept."""
    if not isinstance(repaired, dict) or not text.lstrip().startswith("{") or not _OBJECTS_MEET.search(text):
        return repaired
    items = repair("[" + text + "]")
    if isinstance(items, list) and len(items) > 1 and all(isinstance(item, dict) for item in items) and items[-1] == repaired:
        return items
    return repaired


# Where one object may close and the next open (outside strings or not: only a reason to read the text again as an array).
_OBJECTS_MEET = re.compile(r"\}\s*[;,]?\s*\{")


def read_loosely(text: str) -> Any:
    """`text`'s only object or array, written as JSON by loose_json (its open brackets closed when every value is
    whole), its slips mended, then parsed strictly; None when `text` holds no such value or that does not parse."""
    start = len(text) - len(text.lstrip())
    json_text = loose_json.only_value_as_json(text, start) if text.startswith(("{", "["), start) else None
    if json_text is None:
        return None
    try:
        return loads(slips_mended(json_text))
    except ValueError:
        return None


def slips_mended(text: str) -> str:
    """`text` with its stray backslashes escaped and its trailing commas (outside strings) taken out."""
    return _STRING_OR_TRAILING_COMMA.sub(_keep_strings, _STRAY_BACKSLASH.sub(r"\1\\\\", text))


# A backslash that starts no escape JSON knows (an even run of backslashes before it is escapes of its own).
_STRAY_BACKSLASH = re.compile(r'(?<!\\)((?:\\\\)*)\\(?=[^"\\/bfnrtu])')
# A string, kept as it is (a Go file's `"b",\n}` written with raw newlines is content), or a comma then
# only white space before `}` or `]`, which goes. A string never closed (an answer cut off) runs to the
# end: else the scan started again at each of its escaped quotes, quadratic in a cut-off file.
_STRING_OR_TRAILING_COMMA = re.compile(r'("(?:[^"\\]|\\.)*(?:"|\Z))|,(\s*[}\]])')


def _keep_strings(match: re.Match[str]) -> str:
    return match.group(1) or match.group(2)


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
    return None if _nested_deeper_than(repaired, MAX_JSON_DEPTH) else repaired


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


def decode_string_object(value: Any) -> Any:
    """Arguments sent as a JSON string that encodes an object: the one coercion allowed."""
    if value is None:
        return {}
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            decoded = loads(value)
        except ValueError:
            return value
        if isinstance(decoded, dict):
            return decoded
    return value


# --- values one after another ------------------------------------------------


def values_one_after_another(block: str) -> tuple[list[tuple[Any, str]], tuple[int, ValueError] | None]:
    """The JSON values `block` holds one after another, each with its text, up to the first that does not read, as JSON
    or as a JSON5-like value (see _json5_like_value_at), and where that one starts with its JSON error (None when all of
    `block` reads)."""
    values: list[tuple[Any, str]] = []
    position = 0
    while position < len(block):
        try:
            value, end = raw_decode(block, position)
        except ValueError as exc:
            loose = _json5_like_value_at(block, position)
            if loose is None:
                return values, (position, exc)
            value, end = loose
        values.append((value, block[position:end]))
        position = BETWEEN_VALUES.match(block, end).end()  # type: ignore[union-attr]
    return values, None


def _json5_like_value_at(text: str, start: int) -> tuple[Any, int] | None:
    """The JSON5-like object or array at `start` (single quotes, bare keys, Python's None) and where it closes, read as
    JSON with its slips mended (see read_loosely): the repair would merge it with the values beside it, or end a
    single-quoted string at an apostrophe. None when it does not close, or its reading does not parse or names a key twice
    (then read with the rest, its calls are broken: see loose_json.repeated_key)."""
    read = loose_json.closed_value_as_json(text, start) if text.startswith(("{", "["), start) else None
    if read is None or loose_json.repeated_key(text[start : read[1]]):
        return None
    json_text, end = read
    try:
        return loads(slips_mended(json_text)), end
    except ValueError:
        return None


def values_all_whole(block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None) -> list[tuple[Any, str]]:
    """The values `block` holds one after another when all of it reads (`walked`, with `unread` None), or, when that
    gives fewer than two, all of it once mended (one of them wrote a regex's `\\d` or a trailing comma); else []."""
    several = walked if unread is None else []
    if len(several) < 2:
        mended, unread_mended = values_one_after_another(slips_mended(block))
        several = mended if unread_mended is None else []
    return several


def cut_off_error(block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None) -> str:
    """The JSON error of `block`'s first value that does not read (`unread`, after the values `walked`), when it and
    every value before it is an object or array (calls, not the model's words after them) and it stops inside a string
    or where a value was due (see text_ends_mid_value); else ""."""
    if unread is None or any(raw[0] not in "{[" for raw in (block[unread[0]], *(raw for _, raw in walked))):
        return ""
    exc = unread[1]
    return json_error(exc) if text_ends_mid_value(exc, block) else ""


# --- strict JSON -------------------------------------------------------------


def loads(text: str) -> Any:
    return raw_decode(text, 0, whole=True)[0]


def raw_decode(text: str, start: int, *, whole: bool = False) -> tuple[Any, int]:
    """The JSON value at `start` (or, if `whole`, all of `text`), with JSON nested too deeply to read or
    to use (json's recursion, our guards' own) refused as a ValueError, like any other unreadable JSON."""
    try:
        value, end = (_DECODER.decode(text), len(text)) if whole else _value_at(text, start)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    if _nested_deeper_than(value, MAX_JSON_DEPTH):
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
    """Whether the value at `start` opens a container at a level deeper than MAX_JSON_DEPTH allows (see _nested_deeper_than)
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


def _nested_deeper_than(value: Any, limit: int) -> bool:
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
