"""A call whose JSON does not read where it starts: read whole over several lines once mended, or JSON5-like, or with
only its closing brackets missing; else reported as broken (cut off or unreadable), never dropped without a word."""

from __future__ import annotations

import json
import re

from orchestrator import loose_json
from orchestrator.call_arguments import Arguments
from orchestrator.call_shapes import CALL_FORM, WrittenCall, written_from_value
from orchestrator.cut_off_json import text_ends_mid_value
from orchestrator.json_block_calls import calls_in_block
from orchestrator.mended_json import read_loosely, slips_mended
from orchestrator.strict_json import json_error, loads, raw_decode

# A call's JSON after a sentence on the same line ("I will read it. {"name": ...}").
_INLINE_CALL = re.compile(r'\{\s*"(?:name|tool|function)"\s*:')


def calls_in_unreadable_json(
    text: str, start: int, exc: ValueError, known: set[str], tries_left: list[int]
) -> tuple[list[WrittenCall], int]:
    """The calls in the JSON at `start` that does not read, and where the text after them starts: read whole over
    several lines once mended (see _mended_call_from, _loose_call_from) while `tries_left[0]` allows (the answer's
    count, shared by all its lines, so a one-item list); one whose first line ends where a value goes on (`,` `:` `{`
    `[`) and that never closes, read to the text's end as its one-line twin is (run with its closing brackets added
    when only they are missing, else cut off or unreadable, see unreadable_call_over_lines); else the rest of its
    line as a block (repaired, or cut off)."""
    tried = bool(tries_left[0]) and _LOOSE_CALL.match(text, start) is not None  # not a `{` of code, or other JSON
    if tried:
        tries_left[0] -= 1
        mended = _mended_call_from(text, start, json_error(exc, start), known) if _INLINE_CALL.match(text, start) else None
        mended = mended or _loose_call_from(text, start, known)
        if mended is not None:
            return mended
    line_end = text.find("\n", start)
    line_end = line_end if line_end >= 0 else len(text)
    if tried and line_end < len(text) and _goes_on_and_never_closes(text, start, line_end):
        # Its first line alone (`{'name': 'write_file',`) would be a call without arguments: read whole, it is as its
        # one-line twin is, cut off when it stops mid-value, else run with its closing brackets added. Not when a later
        # line starts a call: cut where a value was due, it would take that call for the value, and lose it.
        if not text_ends_mid_value(_error_of_the_rest(text[start:], start, exc), text[start:]) and (
            _LINE_STARTING_A_CALL.search(text, line_end) is None
        ):
            whole = _call_lacking_only_closing_brackets(text, start, known)
            if whole:
                return whole, len(text)
        calls = unreadable_call_over_lines(text, start, exc, known)
        if calls:
            return calls, line_end
    calls = calls_in_block(text[start:line_end], known, cut=False)
    if not calls and tried:
        calls = unreadable_call_over_lines(text, start, exc, known)
    return calls, line_end


def _goes_on_and_never_closes(text: str, start: int, line_end: int) -> bool:
    """Whether the value at `start` goes on after its first line, which ends where a value goes on (after `,` `:` `{`
    `[`: pretty-printed), and never closes: it runs to the text's end."""
    return text[start:line_end].rstrip().endswith((",", ":", "{", "[")) and loose_json.value_end(text, start) is None


def _call_lacking_only_closing_brackets(text: str, start: int, known: set[str]) -> list[WrittenCall]:
    """The calls of the value at `start` read to the text's end with its closing brackets added, when it lacks only
    them, every value whole (see loose_json.only_value_as_json), and reads so; else [], as when the text ends after a
    comma (more was to come: `{\n "name": "list_dir",` is no call without arguments) or on a quote that may not end
    its last string (see _ends_on_a_quote_that_may_not_close: a write would be run with its content cut off)."""
    if text.rstrip().endswith(",") or _ends_on_a_quote_that_may_not_close(text):
        return []
    call_text = text[start:]
    value = read_loosely(call_text)
    if value is None:
        return []
    return written_from_value(value, call_text, "", known, cut=False, repeated_key=loose_json.repeated_key(call_text)) or []


def _ends_on_a_quote_that_may_not_close(text: str) -> bool:
    """Whether `text` ends on a quote that may be inside its last string, the answer stopped after it: a single quote (one
    inside the string, `'return {'` of `'return {'a': 1}'`), also when only closing brackets and commas follow it (the
    content's own, taken for the arguments' closing: `'const o = {a: 'x',}`, a function's `}` line after `return 'x'`),
    or a double quote closing a string begun on an earlier line (cut inside the string, which then ran on into what came
    after it: a next call's `{"`)."""
    text = text.rstrip()
    if text.rstrip("}], \t\r\n").endswith("'"):
        return True
    last_line = text[text.rfind("\n") + 1 :]
    return text.endswith('"') and len(loose_json.UNESCAPED_DOUBLE_QUOTE.findall(last_line)) % 2 == 1


def known_tool_named_at(text: str, start: int, known: set[str]) -> str | None:
    """The name the call starting at `start` gives as a quoted string on its first line, when it is a known tool's."""
    named = _LOOSE_CALL.match(text, start)
    name = named.group("name") if named is not None else None
    return name if name is not None and name.strip() in known else None


def unreadable_call_over_lines(text: str, start: int, exc: ValueError, known: set[str]) -> list[WrittenCall]:
    """The call at `start` naming a known tool that does not read (`exc`: the error of reading the value at `start`) and
    gives no call otherwise (its first line gives none, `{` alone on it; or, pretty-printed and never closed, read whole
    it does not read; or it follows prose), as a broken call: cut off when the rest of the text stops inside a string
    or where a value was due (see cut_off_json.text_ends_mid_value), else unreadable; [] when it names no tool (other
    JSON the model shows). Dropped, the model would be told it called no tool, not what to fix."""
    name = known_tool_named_at(text, start, known)
    if name is None:
        return []
    rest = text[start:]
    rest_exc = _error_of_the_rest(rest, start, exc)
    if text_ends_mid_value(rest_exc, rest):
        return [WrittenCall(name, Arguments(None, rest, json_error(rest_exc), ends_mid_value=True))]
    closed = loose_json.value_end(text, start)
    raw = text[start:closed] if closed else rest
    detail = f"the call is not valid JSON ({json_error(exc, start)}); write it again as {CALL_FORM}"
    return [WrittenCall(name, Arguments(None, raw), "unparseable", detail)]


def _error_of_the_rest(rest: str, start: int, exc: ValueError) -> ValueError:
    """The error of parsing `rest` (the text from `start`) strictly as one value, from `exc`, the error of reading the
    value at `start`: the decoder's own error is the same, its place counted from `start`. Only an error of ours (the
    value read whole, then refused as nested too deeply) says nothing of what follows it, so then `rest` is parsed."""
    if isinstance(exc, json.JSONDecodeError):
        return json.JSONDecodeError(exc.msg, rest, exc.pos - start)
    try:
        loads(rest)
    except ValueError as rest_exc:
        return rest_exc
    return exc  # never reached: what did not read at `start` does not read as all of `rest`


# Bare calls read whole once mended, at most, in one answer: each try reads the rest of the answer, and an
# answer of many broken call-like lines would take time quadratic in its length.
MENDED_CALLS_TRIED = 8


def _mended_call_from(text: str, start: int, error: str, known: set[str]) -> tuple[list[WrittenCall], int] | None:
    """The call whose JSON starts at `start` and reads whole once mended (a stray backslash, a trailing comma),
    over as many lines as it takes (pretty-printed, a string with raw newlines), and where the line it ends on
    ends, or, when it ends on its first line, where it ends there (the calls after it on the line are read too);
    None when it does not read so. (Its first line alone would be a call cut inside a string.)"""
    mended = slips_mended(text[start:])
    try:
        value, end = raw_decode(mended, 0)
    except ValueError:
        return None
    if "\n" not in mended[:end]:
        end_in_text = loose_json.value_end(text, start)  # mending moved it
        calls = written_from_value(value, text[start:end_in_text], error, known, cut=False) if end_in_text else None
        return (calls, end_in_text) if calls and end_in_text else None
    # Mending adds and removes no line break: the call ends on the same line of `text`.
    line_end = start
    for _ in range(mended.count("\n", 0, end) + 1):
        line_end = text.find("\n", line_end + 1)
        if line_end < 0:
            line_end = len(text)
            break
    calls = written_from_value(value, text[start:line_end], error, known, cut=False)
    return (calls, line_end) if calls else None


# A call's start as small models write JSON5-like text too: `{'name':`, `{name:`, as well as `{"name":`; then the name it
# gives when that is a quoted string on the same line (group "name"), which is optional: `{"name": name_var` or
# `{'name':\n 'x'` starts a call all the same.
_LOOSE_CALL = re.compile(r"""\{\s*(["']?)(?:name|tool|function)\1\s*:(?:\s*(["'])(?P<name>[^"'\n]*)\2)?""")
# A line that starts such a call (after its indentation), alone or as an array's first item (`[{"name":`,
# `{"tool_calls": [{"name":`).
_LINE_STARTING_A_CALL = re.compile(
    r"""^[ \t]*(?:(?:\{\s*"tool_calls"\s*:\s*)?\[\s*)?\{\s*(["']?)(?:name|tool|function)\1\s*:""", re.MULTILINE
)


def _loose_call_from(text: str, start: int, known: set[str]) -> tuple[list[WrittenCall], int] | None:
    """The JSON5-like call at `start` (single quotes, bare keys) over several lines (pretty-printed, or its strings
    holding raw line breaks), read whole to its closing bracket, as JSON (see loose_json.value_as_json), and where it
    ends; None when it closes on its first line, or never (see calls_in_unreadable_json), or its reading is
    no valid JSON (the lines may be calls of their own, one lacking its brace), or is no call."""
    read = loose_json.value_as_json(text, start)
    if read is None:
        return None
    json_text, end = read
    try:
        value = loads(slips_mended(json_text))  # a regex's `\\d`, a trailing comma: slips mended as in double-quoted JSON
    except ValueError:
        return None
    calls = written_from_value(value, json_text, "", known, cut=False, repeated_key=loose_json.repeated_key(text[start:end]))
    return (calls, end) if calls else None
