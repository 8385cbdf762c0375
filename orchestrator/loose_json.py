"""JSON5-like text as small models write their calls' arguments, read loosely: 'single-quoted' strings, bare keys
and words (Python's True and None), objects one after another. json_repair reads such text, but it cannot say
whether the text stops in the middle of a value (a call cut off, which must not run with half a value), it reads an
apostrophe inside a single-quoted string (`'it's done'`) as the string's end, and it drops the line breaks that end a
string (a file's last newline): so a lone value is written here as JSON (its closing brackets added when only they are
missing) and read strictly. orchestrator/call_arguments.py and the readers of calls written in the text (written_calls.py's forms) ask
this module only once strict JSON has failed, so a healthy call never pays for it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# What may stand between two values written one after another: Llama 3's `; `, a comma, white space.
BETWEEN_VALUES = re.compile(r"\s*[;,]?\s*")

# A double-quoted string ends at its first unescaped quote, as in JSON. A single-quoted one runs to a quote before what
# may follow a string (`,` `:` `}` `]`, or the text's end), as the one inside a word (it's) is the string's own; that
# quote is its end unless what follows cannot follow it there (see _may_end_a_value). The quote that may close it is
# captured: an empty group is a string the text ends inside of.
_DOUBLE_QUOTED = re.compile(r'"(?:[^"\\]|\\(?:.|\Z))*+("?)', re.DOTALL)
_SINGLE_QUOTED_TO_A_CLOSE = re.compile(r"(?:[^'\\]|\\(?:.|\Z)|'(?!\s*(?:[,:}\]]|\Z)))*+('?)", re.DOTALL)
# What follows an object's member and its comma: the next key (quoted or bare) and its colon, a closing brace (a
# trailing comma), or the text's end on the way (where it stops, nothing can be told).
_NEXT_KEY = re.compile(r"""\s*(?:\Z|\}|(?:'[^'\n]{0,100}(?:'|\Z)|"[^"\n]{0,100}(?:"|\Z)|[^\s{}\[\],:'"]{1,100})\s*(?::|\Z))""")
# A bare key or word (True, None, 12): up to white space or a bracket, comma or colon.
_WORD = re.compile(r"[^\s{}\[\],:]+")
_LITERALS = ("true", "false", "null", "True", "False", "None")


def stops_mid_value(text: str) -> bool:
    """Whether `text`, read loosely as JSON5-like objects or arrays one after another, stops inside a string, after a
    key, where a value was due, or inside a literal or after a number's sign (`Tru`, `-`), or, never closing, may stop
    inside a single-quoted string (see _may_end_inside_its_last_string), or was read with a quote inside a string taken
    for content or for its end, wherever it stops. The reading ends, whole, at the first value closed and not followed
    by another object or array (the model's words after its call), unless a quote inside the content, read as a
    string's end, may have made the content's own bracket close it: its last key's value opens more brackets than it
    closes (see _opens_more_than_it_closes), or a string or word follows a bracket after a double-quoted string inside
    it, and only closing brackets follow; or a double-quoted string of it was followed by a word, string or bracket and its
    double quotes are odd in number, a string never closed."""
    position = len(text) - len(text.lstrip())
    if not text.startswith(("{", "["), position):
        return False
    open_brackets: list[str] = []
    before = last = ""  # the last two tokens read: a bracket, a comma or colon, a quote for a string, or a bare word
    last_string = ""  # the text of the last value's last string, quotes included
    string_end = 0  # where it ends
    # How many brackets were open where a single-quoted string held a quote, or a colon followed a string that was no
    # key (0: nowhere in this value, or only in an array's item since closed): a quote inside the content read as its own.
    guessed_at = 0
    # The last key's value: where it starts, how many brackets were open at its key, whether its reading guessed where a
    # string ends (as guessed_at), and, once its object closed, whether that may have been the content's bracket and where.
    member_start = member_depth = member_closed_at = 0
    member_guessed = member_cut = False
    # The bracket the last key's object closed (`{`, or `[` where the content's `]` was read as a bracket), and where a value
    # closed on what may have been its content's bracket (see member_cut) and which: what follows it is then its content.
    member_opened = cut_opened = ""
    cut_at = 0
    # Whether a string or word came right after a closing bracket inside the value, a double-quoted string before it
    # (`"s = "}"; f(s);"}`): that bracket was the content's own, after a quote of the content taken for the string's end.
    # (After a single-quoted one, where its strings end was guessed already: see guessed_at. So once a single-quoted string
    # of the value held a quote, `'o = {a: 'x', b: "y"};'`: the double-quoted string and its bracket are the content's.)
    closed_by_the_content = single_quote_guessed = False
    # Whether a double-quoted string was ended by a quote of its content (a word, string or bracket right after it), and where
    # the value read began: its double quotes, counted, then say whether a string never closed.
    double_quote_taken_for_an_end, value_start = False, position
    while position < len(text):
        char = text[position]
        if char.isspace():
            position += 1
            continue
        token, after = token_at(text, position, last, open_brackets[-1] if open_brackets else "")
        if token == "":
            return True  # a string the text ends inside of
        after_double_quotes = last_string.startswith('"')  # the string before this token
        if token == '"':
            last_string, string_end = text[position:after], after
        key_colon = token == ":" and open_brackets[-1:] == ["{"] and before in ("{", ",")
        # A string followed by a word, a string or an opening bracket, no comma or colon between (`"print("hi")"`), was
        # ended by a quote of its content; so was a double-quoted one before a bracket that a string or word follows inside
        # the value (`"s = "}"; f(s);"`), that bracket the content's own.
        string_then_a_word = last == '"' and token not in ("}", "]", ",", ":")
        after_a_bracket = last in ("}", "]") and before == '"' and after_double_quotes and bool(open_brackets)
        after_a_bracket = after_a_bracket and not single_quote_guessed
        after_a_bracket = after_a_bracket and token not in ("{", "}", "[", "]", ",", ":")  # `}{`: items, a comma missing
        closed_by_the_content = closed_by_the_content or after_a_bracket
        double_quote_taken_for_an_end = (
            double_quote_taken_for_an_end or after_a_bracket or (string_then_a_word and after_double_quotes)
        )
        holds_its_quote = token == '"' and char == "'" and "'" in last_string[1:-1]  # a single-quoted string holding a '
        single_quote_guessed = single_quote_guessed or holds_its_quote
        if (
            holds_its_quote
            or (token == ":" and last == '"' and not key_colon)
            or string_then_a_word
            or after_a_bracket
        ):
            guessed_at = min(guessed_at or len(open_brackets), len(open_brackets))
            member_guessed = True
        position = after
        if key_colon:
            member_start, member_depth, member_guessed, member_cut = after, len(open_brackets), False, False
        if char in "{[":
            open_brackets.append(char)
        elif char in "}]":
            opened = open_brackets.pop() if open_brackets else char  # `]` may close a `{`: the content's, read as a bracket
            if member_depth and len(open_brackets) == member_depth - 1:
                member_cut = member_guessed and _opens_more_than_it_closes(text[member_start : position - 1])
                member_depth, member_closed_at, member_opened = 0, position, opened
            if open_brackets[-1:] == ["["] and guessed_at > len(open_brackets):
                guessed_at = 0  # an array's item closed, the calls before a cut one: its reading stands
            if not open_brackets:
                if member_cut and not cut_at:
                    # Kept over the values after it: the content's own (`, {'id': 2}]`) may be read so.
                    cut_at, cut_opened = member_closed_at, member_opened
                position = BETWEEN_VALUES.match(text, position).end()  # type: ignore[union-attr]
                if not text.startswith(("{", "["), position):
                    if double_quote_taken_for_an_end and len(UNESCAPED_DOUBLE_QUOTE.findall(text, value_start)) % 2:
                        return True  # an odd count: a string that never closed, the answer stopped inside it
                    if closed_by_the_content:
                        return not text[position:].strip("}], \t\r\n")
                    # The content's bracket, then the end, or the rest of the content with no bracket of the arguments' after it
                    # (`'t = {'a': 'b'}\nu = {'c': 'd'}`): a whole value closes them after its last quote (`...'d'}'}`).
                    rest = text[cut_at:]
                    return bool(cut_at) and (not rest.strip("}], \t\r\n") or not _closes_more_than_it_opens(rest, cut_opened))
                token, last_string, guessed_at, member_cut, closed_by_the_content = "", "", 0, False, False
                single_quote_guessed = False
                double_quote_taken_for_an_end, value_start = False, position
        before, last = last, token
    # A single-quoted string holding a quote, or a colon after a string that was no key, is a quote inside the content
    # that the reading took for content (`'const o = {a: 'x'`) or for a string's end (`'if x == 'y'`, then `:`): where
    # this value's strings end is a guess, and what follows may be the content's own words, brackets or keys (`'const o =
    # {a: 'x', 'path': 'a.py'}`), so the answer may have stopped anywhere inside it. Read on, a write ran with its content
    # cut (`'x = {'a': 'b'}\ny =`), or to another file; a whole value of that shape lacking its brackets is lost.
    if open_brackets and guessed_at:
        return True
    if open_brackets and _may_end_inside_its_last_string(text[string_end:], last_string):
        return True
    if not open_brackets or last in ("", "{", "[", "}", "]", ","):
        return False  # every value whole: what is missing is brackets only
    if last == ":":
        return True  # a value was due
    if open_brackets[-1] == "{" and before in ("{", ","):
        return True  # a key, and no value
    in_value = before in (":", "[", ",")
    return in_value and last != '"' and (last == "-" or any(literal.startswith(last) and literal != last for literal in _LITERALS))


def _opens_more_than_it_closes(value_text: str) -> bool:
    """Whether `value_text`, a value read with a quote of its content taken for a string's end, opens more braces or
    brackets than it closes, counted whether quoted or not: then the bracket that closed its object after it was likely
    the content's own (`'t = {'a': 'b'}` or `"d = {"k": 1}`, the answer stopped after it), not the arguments'. A whole
    value of that shape (`'if x == 'y': pass'`, `"f("a")"`) closes what it opens, and still runs; one that does not
    (`'if (x == 'y') {'`, the content's brace left open) cannot be told from a cut one, and is lost."""
    return value_text.count("{") > value_text.count("}") or value_text.count("[") > value_text.count("]")


def _closes_more_than_it_opens(rest: str, opened: str) -> bool:
    """Whether `rest`, what follows a value `opened` with `{` or `[` and closed by a bracket that may have been its
    content's (see _opens_more_than_it_closes), closes more of its kind than it opens: the value's own, still to come."""
    return rest.count("}" if opened == "{" else "]") > rest.count(opened)


# A double quote not escaped (an even run of backslashes before it is escapes of their own).
UNESCAPED_DOUBLE_QUOTE = re.compile(r'(?<!\\)(?:\\\\)*"')


# A path or a name (`a.py`, `src/`, `list_dir`, `v2`): one word holding a digit, `_`, `.`, `/` or `-`, as no word of prose
# whose apostrophe may come next (`'it'` of `'it's'`) does, nor code before a quote that opens a string (`s = '`, `print('`).
# (A lookahead, not `[\w./-]*[\d_./-][\w./-]*`, which backtracks quadratically on a long string that fails.)
_PATH_OR_NAME = re.compile(r"(?=.*[\d_./-])[\w./-]+")


def _may_end_inside_its_last_string(after: str, last_string: str) -> bool:
    """Whether a value that never closes may stop inside its last string (`last_string`, `after` it only the rest of the
    text): when that string is single-quoted, followed only by closing brackets, commas and white space, and is no path
    or name (see _PATH_OR_NAME). Its last quote may then be one inside the content after which the answer stopped
    (`'return {'` of `'return {'a': 1}'`, `'s = 'x'`, `'it'` of `'it's'`), and what follows it the content's own
    brackets: read as the string's end, a write ran cut. A path or a name (`'a.py'`) seldom goes on after a quote, so
    a call ending on one still runs (`'v2'` of `'v2's notes'` is the rare one that does); a whole call ending on any
    other string is lost, as text alone cannot tell it from a cut one. A double-quoted one may too when it ends where
    code opens a string (`"print("`, `"x = "`, `"d = {"`, `"f(f"`): the content's own quote, not escaped, then the
    stop; a whole one seldom ends so."""
    if after.strip("}], \t\r\n"):
        return False
    if last_string.startswith('"'):
        return _OPENS_A_STRING.search(last_string, 0, len(last_string) - 1) is not None
    return _PATH_OR_NAME.fullmatch(last_string[1:-1]) is None


# Where code opens a string: after a bracket or `=` (and white space), a comma or colon and white space (not `def f():`),
# or a prefix (`f`, `rb`) right after one of them (`print(f`, `x = f`; not `a + b`).
_OPENS_A_STRING = re.compile(r"(?:[(\[{=]|[,:](?=[ \t])|(?:(?<=[(\[{=,])|(?<=[=,:] ))[rbfuRBFU]{1,2})[ \t]*\Z")


def token_at(text: str, position: int, last: str, inside: str = "") -> tuple[str, int]:
    """The JSON5-like token at `position` (after the token `last`, inside the bracket `inside`, "" for none) and where it
    ends: a bracket, a comma or colon, `"` for a string (quoted either way), "" for a string the text ends inside of, a
    bare word, or white space."""
    char = text[position]
    if char.isspace():
        return " ", position + 1
    if char == '"' and last in ("", "{", "[", ",", ":"):
        string = _DOUBLE_QUOTED.match(text, position)
        return ('"' if string.group(1) else ""), string.end()  # type: ignore[union-attr]
    if char == "'" and last in ("", "{", "[", ",", ":"):
        closes, end = _single_quoted_string(text, position, inside, key=inside == "{" and last in ("{", ","))
        return ('"' if closes else ""), end
    if char in "{}[],:":
        return char, position + 1
    # A quote that starts no string (27" wide, after a word) is part of a word.
    word = _WORD.match(text, position)
    return (word.group(), word.end()) if word else (char, position + 1)


def _single_quoted_string(text: str, position: int, inside: str, *, key: bool) -> tuple[bool, int]:
    """Whether the single-quoted string at `position` (a key, or a value inside the bracket `inside`) closes, and where it
    ends: at the first quote that may close it (see _SINGLE_QUOTED_TO_A_CLOSE) and, for a value, may end one there."""
    at = position + 1
    while True:
        run = _SINGLE_QUOTED_TO_A_CLOSE.match(text, at)
        assert run is not None  # it matches everywhere, if only the empty string
        if not run.group(1):
            return False, run.end()
        if key or _may_end_a_value(text, run.end(), inside):
            return True, run.end()
        at = run.end()


# The first character after white space: matched in place, as a slice of the rest at each quote would copy it each time.
_NEXT_CHAR = re.compile(r"\s*(\S)")


def _may_end_a_value(text: str, after: int, inside: str) -> bool:
    """Whether a value inside the bracket `inside` may end where the quote before `after` stands, by what follows it: not
    the other kind of closing bracket, nor, in an object, a comma followed by what is no key and colon (`'a = d['k'],
    b'`: `]` in an object, then `, b'`); where the text stops before that can be told, it may. A colon always may: a
    value is never followed by one, but a string cut off before the next call would run into that call's `'name':`."""
    next_char = _NEXT_CHAR.match(text, after)
    follower = next_char.group(1) if next_char else ""
    if follower in ("}", "]"):
        return inside in ("", {"}": "{", "]": "["}[follower])
    if follower == "," and inside == "{":
        return _NEXT_KEY.match(text, text.index(",", after) + 1) is not None
    return True


def value_as_json(text: str, start: int) -> tuple[str, int] | None:
    """The JSON5-like object or array at `start`, written as JSON as closed_value_as_json writes it, and where it ends;
    None unless it closes on a later line than its first (pretty-printed, or a string with raw line breaks)."""
    read = closed_value_as_json(text, start)
    return read if read is not None and "\n" in text[start : read[1]] else None


def closed_value_as_json(text: str, start: int) -> tuple[str, int] | None:
    """The JSON5-like object or array at `start`, read as stops_mid_value reads, written as JSON (its strings
    double-quoted, its bare keys quoted, Python's True, False and None as JSON's), and where it closes; None when the
    text ends first. The repair is not used, as it reads an apostrophe before a line break as a string's end. What is
    written need not be valid JSON (lines that are calls of their own, one lacking its brace, are read as one value):
    the caller parses it strictly."""
    read = _read_as_json(text, start)
    return (read.json, read.end) if read is not None and not read.open_brackets else None


def only_value_as_json(text: str, start: int) -> str | None:
    """The JSON5-like object or array at `start`, written as JSON as value_as_json writes it (on one line or several),
    when it is the text's only value: what follows it is white space or words (the model's, after its call; see
    only_words). A text that ends with every value whole but brackets still open (see stops_mid_value) has them
    closed, as its writer meant; one that stops mid-value is None, as it cannot be told what was meant. The repair is
    not used: it reads an apostrophe inside a single-quoted string as the string's end, and drops the line breaks
    that end a string (a file's last newline)."""
    read = _read_as_json(text, start)
    if read is None:
        return None
    if read.open_brackets:
        if stops_mid_value(text[start:]):
            return None
        json_text, open_brackets = _without_an_item_just_begun(read.json, read.open_brackets)
        return json_text + "".join(_CLOSING[bracket] for bracket in reversed(open_brackets))
    return read.json if only_words(text[read.end :]) else None


# An array's later item of which only the opening bracket was written (`[{...}, {`): a call cut off before its name. (The
# white space before its comma is stripped apart: searched for, a leading `\s*` tried each space of a long run to its end.)
_ITEM_JUST_BEGUN = re.compile(r",\s*[{\[]\s*\Z")


def _without_an_item_just_begun(json_text: str, open_brackets: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """`json_text` without an array's last item when only its opening bracket was written, and the brackets left open:
    closed, it would be an empty object among the calls (which then are none), not the calls before it."""
    begun = _ITEM_JUST_BEGUN.search(json_text)
    if begun is None or open_brackets[-2:-1] != ("[",):
        return json_text, open_brackets
    return json_text[: begun.start()].rstrip(), open_brackets[:-1]


@dataclass(frozen=True)
class _AsJson:
    """A JSON5-like value read as JSON: its text, where the reading ended, and the brackets the text ended inside."""

    json: str
    end: int
    open_brackets: tuple[str, ...]


_CLOSING = {"{": "}", "[": "]"}


def only_words(rest: str) -> bool:
    """Whether `rest`, after a value, is white space or the model's words after its call: not another object or array,
    nor text that starts or ends with a quote or holds a bracket, a sign that the value closed early (a single-quoted
    string's quote before a bracket inside it, `'d = {1: 'a', 2: 'b'}'`, read as its end)."""
    rest = rest.strip()
    return not rest or (rest[0] not in "'\"" and rest[-1] not in "'\"" and not any(bracket in rest for bracket in "{}[]"))


def _read_as_json(text: str, start: int, *, written: bool = True) -> _AsJson | None:
    """The JSON5-like object or array at `start` written as JSON (unless not `written`: only where it ends is wanted), up
    to where it closes or, with brackets still open, the text ends; None when the text ends inside a string."""
    pieces: list[str] = []
    open_brackets: list[str] = []
    last, position = "", start
    while position < len(text):
        char = text[position]
        token, after = token_at(text, position, last, open_brackets[-1] if open_brackets else "")
        if token == "":
            return None  # a string the text ends inside of
        if written:
            pieces.append(_token_as_json(text[position:after], token, last, open_brackets[-1] if open_brackets else ""))
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


def _token_as_json(token_text: str, token: str, last: str, inside: str) -> str:
    """The token `token_text` (read as `token`, after the token `last`, inside the bracket `inside`) as JSON writes it."""
    if token == '"':
        return _as_json_string(token_text)
    if token not in ("{", "}", "[", "]", ",", ":", " ") and last in ("{", ",") and inside == "{":
        return json.dumps(token)  # a bare key
    return _PYTHON_LITERALS.get(token, token_text)


def repeated_key(text: str) -> str:
    """The first key (a colon after it) that the JSON5-like object or array starting `text` (after white space), read as
    stops_mid_value reads it (to where it closes, or the text's end), names twice in one object, at any depth; "" for
    none. Read so (or by json_repair, which ends a single-quoted string at the same quotes), a quote inside a string's
    content taken for its end makes the content's own keys the object's (`'d = {'name': 'x', 'path': 'a.py'}'`), and the
    last one would win."""
    position = len(text) - len(text.lstrip())
    if not text.startswith(("{", "["), position):
        return ""
    keys: list[set[str] | None] = []  # each open bracket's keys so far: an object's set, None for an array
    last = ""
    while position < len(text):
        char = text[position]
        token, after = token_at(text, position, last, "" if not keys else "[" if keys[-1] is None else "{")
        if token == "":
            return ""  # a string the text ends inside of
        in_key_place = keys and keys[-1] is not None and last in ("{", ",")
        if in_key_place and token not in ("{", "}", "[", "]", ",", ":", " ") and _colon_follows(text, after):
            key = text[position + 1 : after - 1] if token == '"' else token
            if key in keys[-1]:
                return key
            keys[-1].add(key)
        position = after
        if char in "{[":
            keys.append(set() if char == "{" else None)
        elif char in "}]" and keys:
            keys.pop()
            if not keys:
                return ""
        if token != " ":
            last = token
    return ""


def _colon_follows(text: str, after: int) -> bool:
    """Whether a colon follows `after` (after white space), as one follows a key. A double-quoted string's unescaped quote
    read as its end makes the content's quoted words keys to this reading (`"f("old", "new")"`), not to json_repair's,
    which reads the call whole (it took such words for keys only where a colon followed them, in every shape tried)."""
    next_char = _NEXT_CHAR.match(text, after)
    return next_char is not None and next_char.group(1) == ":"


def value_end(text: str, start: int) -> int | None:
    """Where the object or array at `start` closes, read as stops_mid_value reads (a stray backslash, a
    trailing comma, single quotes do not stop it); None when the text ends first."""
    read = _read_as_json(text, start, written=False)  # a flood of calls that never close is looked at so: not written
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
