"""JSON5-like text as small models write their calls' arguments, read loosely: 'single-quoted' strings, bare keys
and words (Python's True and None), objects one after another. json_repair reads such text, but it cannot say
whether the text stops in the middle of a value (a call cut off, which must not run with half a value), it reads an
apostrophe inside a single-quoted string (`'it's done'`) as the string's end, and it drops the line breaks that end a
string (a file's last newline): so a lone value is written here as JSON (its closing brackets added when only they are
missing) and read strictly. orchestrator/toolcalls.py asks this module only once strict JSON has failed, so a healthy
call never pays for it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# What may stand between two values written one after another: Llama 3's `; `, a comma, white space.
BETWEEN_VALUES = re.compile(r"\s*[;,]?\s*")

# A double-quoted string ends at its first unescaped quote, as in JSON; a single-quoted one only at a quote before
# what may follow a string (`,` `:` `}` `]`, or the text's end), as the one inside a word (it's) is the string's own.
# The closing quote is captured: an empty group is a string the text ends inside of.
_STRING = {
    '"': re.compile(r'"(?:[^"\\]|\\(?:.|\Z))*+("?)', re.DOTALL),
    "'": re.compile(r"'(?:[^'\\]|\\(?:.|\Z)|'(?!\s*(?:[,:}\]]|\Z)))*+('?)", re.DOTALL),
}
# A bare key or word (True, None, 12): up to white space or a bracket, comma or colon.
_WORD = re.compile(r"[^\s{}\[\],:]+")
_LITERALS = ("true", "false", "null", "True", "False", "None")


def stops_mid_value(text: str) -> bool:
    """Whether `text`, read loosely as JSON5-like objects or arrays one after another, stops inside a string, after a
    key, where a value was due, or inside a literal or after a number's sign (`Tru`, `-`). The reading ends, whole,
    at the first value closed and not followed by another object or array (the model's words after its call)."""
    position = len(text) - len(text.lstrip())
    if not text.startswith(("{", "["), position):
        return False
    open_brackets: list[str] = []
    before = last = ""  # the last two tokens read: a bracket, a comma or colon, a quote for a string, or a bare word
    while position < len(text):
        char = text[position]
        if char.isspace():
            position += 1
            continue
        token, position = token_at(text, position, last)
        if token == "":
            return True  # a string the text ends inside of
        if char in "{[":
            open_brackets.append(char)
        elif char in "}]":
            if open_brackets:
                open_brackets.pop()
            if not open_brackets:
                position = BETWEEN_VALUES.match(text, position).end()  # type: ignore[union-attr]
                if not text.startswith(("{", "["), position):
                    return False
                token = ""
        before, last = last, token
    if not open_brackets or last in ("", "{", "[", "}", "]", ","):
        return False  # every value whole: what is missing is brackets only
    if last == ":":
        return True  # a value was due
    if open_brackets[-1] == "{" and before in ("{", ","):
        return True  # a key, and no value
    in_value = before in (":", "[", ",")
    return in_value and last != '"' and (last == "-" or any(literal.startswith(last) and literal != last for literal in _LITERALS))


def token_at(text: str, position: int, last: str) -> tuple[str, int]:
    """The JSON5-like token at `position` (after the token `last`) and where it ends: a bracket, a comma or colon, `"`
    for a string (quoted either way), "" for a string the text ends inside of, a bare word, or white space."""
    char = text[position]
    if char.isspace():
        return " ", position + 1
    if char in "'\"" and last in ("", "{", "[", ",", ":"):
        string = _STRING[char].match(text, position)
        return ('"' if string.group(1) else ""), string.end()  # type: ignore[union-attr]
    if char in "{}[],:":
        return char, position + 1
    # A quote that starts no string (27" wide, after a word) is part of a word.
    word = _WORD.match(text, position)
    return (word.group(), word.end()) if word else (char, position + 1)


def value_as_json(text: str, start: int) -> tuple[str, int] | None:
    """The JSON5-like object or array at `start`, read as stops_mid_value reads, written as JSON (its strings
    double-quoted, its bare keys quoted, Python's True, False and None as JSON's), and where it ends; the repair is not
    used, as it reads an apostrophe before a line break as a string's end. None unless it closes on a later line than
    its first, with every line break it spans inside a string."""
    read = _read_as_json(text, start, line_breaks_between_values=False)
    if read is None or read.open_brackets or "\n" not in text[start : read.end]:
        return None
    return read.json, read.end


def only_value_as_json(text: str, start: int) -> str | None:
    """The JSON5-like object or array at `start`, written as JSON as value_as_json writes it (on one line or several),
    when it is the text's only value: what follows it is white space or words (the model's, after its call; see
    _only_words). A text that ends with every value whole but brackets still open (see stops_mid_value) has them
    closed, as its writer meant; one that stops mid-value is None, as it cannot be told what was meant. The repair is
    not used: it reads an apostrophe inside a single-quoted string as the string's end, and drops the line breaks
    that end a string (a file's last newline)."""
    read = _read_as_json(text, start, line_breaks_between_values=True)
    if read is None:
        return None
    if read.open_brackets:
        if stops_mid_value(text[start:]):
            return None
        return read.json + "".join(_CLOSING[bracket] for bracket in reversed(read.open_brackets))
    return read.json if _only_words(text[read.end :]) else None


@dataclass(frozen=True)
class _AsJson:
    """A JSON5-like value read as JSON: its text, where the reading ended, and the brackets the text ended inside."""

    json: str
    end: int
    open_brackets: tuple[str, ...]


_CLOSING = {"{": "}", "[": "]"}


def _only_words(rest: str) -> bool:
    """Whether `rest`, after a value, is white space or the model's words after its call: not another object or array,
    nor text that starts or ends with a quote or holds a bracket, a sign that the value closed early (a single-quoted
    string's quote before a bracket inside it, `'d = {1: 'a', 2: 'b'}'`, read as its end)."""
    rest = rest.strip()
    return not rest or (rest[0] not in "'\"" and rest[-1] not in "'\"" and not any(bracket in rest for bracket in "{}[]"))


def _read_as_json(text: str, start: int, *, line_breaks_between_values: bool) -> _AsJson | None:
    """The JSON5-like object or array at `start` written as JSON, up to where it closes or, with brackets still open,
    the text ends; None when the text ends inside a string, or at a line break between values unless allowed."""
    pieces: list[str] = []
    open_brackets: list[str] = []
    last, position = "", start
    while position < len(text):
        char = text[position]
        token, after = token_at(text, position, last)
        if token == "" or (char == "\n" and token == " " and not line_breaks_between_values):
            return None  # a string the text ends inside of, or a line break between values
        if token == '"':
            pieces.append(_as_json_string(text[position:after]))
        elif token not in ("{", "}", "[", "]", ",", ":", " ") and last in ("{", ",") and open_brackets[-1:] == ["{"]:
            pieces.append(json.dumps(token))  # a bare key
        else:
            pieces.append(_PYTHON_LITERALS.get(token, text[position:after]))
        position = after
        if char in "{[":
            open_brackets.append(char)
        elif char in "}]" and open_brackets:
            open_brackets.pop()
            if not open_brackets:
                return _AsJson("".join(pieces), after, ())
        if token != " ":
            last = token
    return _AsJson("".join(pieces), position, tuple(open_brackets))


def value_end(text: str, start: int) -> int | None:
    """Where the object or array at `start` closes, read as stops_mid_value reads (a stray backslash, a
    trailing comma, single quotes do not stop it); None when the text ends first."""
    read = _read_as_json(text, start, line_breaks_between_values=True)
    return read.end if read is not None and not read.open_brackets else None


_PYTHON_LITERALS = {"True": "true", "False": "false", "None": "null"}


def _as_json_string(quoted: str) -> str:
    """A string as JSON writes it, from its text quoted either way; a line break in it (`\\r` too) escaped."""
    if quoted[0] == '"':
        return quoted.replace("\r", "\\r").replace("\n", "\\n")
    out: list[str] = []
    inner, i = quoted[1:-1], 0
    while i < len(inner):
        char = inner[i]
        if char == "\\" and i + 1 < len(inner):
            follower = inner[i + 1]
            out.append("'" if follower == "'" else char + follower)
            i += 2
            continue
        out.append({'"': '\\"', "\n": "\\n", "\r": "\\r"}.get(char, char))
        i += 1
    return '"' + "".join(out) + '"'
