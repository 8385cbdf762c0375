"""Find the calls a model wrote in its answer's text, which no server parsed into native calls.

Small models that ignore the tools API write calls in many forms: in `<tool_call>`
tags, in code fences, as bare JSON (a line each, or `{...}; {...}`), after a sentence,
in `<function=name>` blocks, in Mistral's (`name[ARGS]{...}`) and DeepSeek's tokens, or
as Python lines (`[read_file(path="a.py")]`). `calls_in_text` gives the calls of the
first form that has any, each with its name and its arguments as read
(orchestrator/call_arguments.py), or, when it cannot be read (cut off, cut by a fence's
```, unreadable), what is wrong with it; orchestrator/toolcalls.py then checks each
against its tool's schema.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Iterator

from orchestrator import loose_json
from orchestrator.call_arguments import (
    CUT_OFF,
    Arguments,
    cut_off_error,
    json_error,
    loads,
    raw_decode,
    read_arguments,
    read_loosely,
    read_repaired,
    repair,
    slips_mended,
    text_ends_mid_value,
    values_all_whole,
    values_one_after_another,
)

# Fence languages a model uses for a call; a ```python fence is never a call.
# A JSON value whose first key is double-quoted: `{"name"` or `[{"name"`.
_DOUBLE_QUOTED_KEY = re.compile(r'[\[\s]*\{\s*"')
_CALL_FENCE_LANGUAGES = {"", "json", "json5", "jsonc", "tool_call", "tool", "tool_code", "function"}
_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
# Possessive (*+): a fence line with no line break after it fails at once instead of being
# re-split between the three parts in every way (quadratic in the reply's length).
_FENCE = re.compile(r"```[ \t]*+([\w+-]*+)[^\n]*+\n(.*?)(?:```|\Z)", re.DOTALL)
_FENCE_MARK = "```"
_FUNCTION_TAG = re.compile(r"<function=([^>\s]*)>(.*?)(</function>|\Z)", re.DOTALL)
_PARAMETER_TAG = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_JSON_START = re.compile(r"^[ \t]*([\[{])", re.MULTILINE)
# The tokens Llama 3 (`<|python_tag|>`) and Mistral (`[TOOL_CALLS]`) put before a call, left in
# the text when the server does not parse them: the call's JSON starts where they end.
_CALL_MARKER = re.compile(r"^([ \t]*)(?:<\|python_tag\|>|\[TOOL_CALLS\])", re.MULTILINE)
# A call's JSON after a sentence on the same line ("I will read it. {"name": ...}"); and such a call whose key is double- or
# single-quoted (`{'name': ...`, JSON5-like).
_INLINE_CALL = re.compile(r'\{\s*"(?:name|tool|function)"\s*:')
_INLINE_CALL_EITHER_QUOTE = re.compile(r"""\{\s*(["'])(?:name|tool|function)\1\s*:""")
# An array opened right before such a call, which the call is an item of: `[`, `{"tool_calls": [`.
_ARRAY_BEFORE_A_CALL = re.compile(r'(?:\{\s*"tool_calls"\s*:\s*)?\[\s*\Z')
_ARRAY_OPENING_LIMIT = 64  # how far before the call its array's opening is looked for: a bounded look, not back to the start
_CALL_FORM = 'a JSON object like {"name": "read_file", "arguments": {"path": "a.py"}}'
_NAME_IN_TEXT = re.compile(r'"(?:name|tool)"\s*:\s*"([^"]*)"')


@dataclass(frozen=True)
class WrittenCall:
    """A call found in the text, not yet checked."""

    name: str
    arguments: Arguments
    # Set when the call cannot be read at all; `arguments` then holds only the raw text.
    problem: str = ""
    detail: str = ""


def calls_in_text(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """Calls in the first form that has any: tags, fences, bare JSON, then JSON after a sentence."""
    # An unclosed tag whose body is no call (`I will call it with a <tool_call>.`) is the model talking about
    # the form; a closed one is surely meant as a call, and said to be unreadable when it is.
    tagged = [tag for tag in _TOOL_CALL_TAG.finditer(text) if tag.group(2) or _meant_as_a_call(tag.group(1), known)]
    if tagged:
        # A tag neither closed nor followed by another runs to the answer's end: what it holds may stop mid-value.
        ends = [not tag.group(2) and tag.end() == len(text) for tag in tagged]
        return [found for tag, end in zip(tagged, ends) for found in _calls_in_tag(tag.group(1), known, cut, ends_the_answer=end)]
    for finder in (_calls_after_names, _calls_in_deepseek_tokens):
        found = finder(text, known, cut)
        if found:
            return found
    text = _CALL_MARKER.sub(r"\1", text)
    for finder in (_calls_in_fences, _calls_in_function_tags, _calls_in_bare_json, _calls_after_prose, _calls_as_python):
        found = finder(text, known, cut)
        if found:
            return found
    return []


# Mistral's newer form, `[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}`: the name, then its arguments' JSON.
# (A name starts where no name character is before it, and is taken whole: linear in a long word.)
_NAME_THEN_ARGUMENTS = re.compile(r"(?<![\w.-])([\w.-]++)\[ARGS\]")
# DeepSeek's tokens (V3, R1): `<｜tool▁call▁begin｜>[function<｜tool▁sep｜>]name[<｜tool▁sep｜>]{json}` or a ```json fence.
_DEEPSEEK_CALL = re.compile(r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>)?([\w.-]+)(?:<｜tool▁sep｜>)?\s*(?:```(?:json)?\s*)?")


def _calls_after_names(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    return _calls_named_before_json(_NAME_THEN_ARGUMENTS, text, cut, where=functools.partial(_begins_a_mistral_call, known=known))


def _begins_a_mistral_call(text: str, match: re.Match[str], previous_end: int, known: set[str]) -> bool:
    """`name[ARGS]` is a call when it names a tool (after prose, in a list, in backticks), or, naming
    none, where the model begins a call: the answer's start, after `[TOOL_CALLS]`, right after the call
    before, or a line's start. Elsewhere an unknown name (`x = options[ARGS]` in a file an edit writes)
    is text."""
    if match.group(1) in known:
        return True
    start = match.start()
    before = text[:start].rstrip(" \t")
    after_a_call = previous_end >= 0 and not text[previous_end:start].strip(" \t\n,;")
    return not before.strip() or before.endswith(("[TOOL_CALLS]", "\n")) or after_a_call


def _calls_in_deepseek_tokens(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    return _calls_named_before_json(_DEEPSEEK_CALL, text, cut)


def _calls_named_before_json(form: re.Pattern[str], text: str, cut: bool, where: Any = None) -> list[WrittenCall]:
    """Calls written as a name `form` matches, followed by the arguments' JSON; not a match inside the
    arguments of the call before it, nor one `where(text, match, previous_end)` refuses."""
    found: list[WrittenCall] = []
    previous_end = -1
    for match in form.finditer(text):
        if match.start() < previous_end:
            continue  # inside the call before: its arguments' text
        if where is not None and not where(text, match, previous_end):
            continue
        try:
            value, end = raw_decode(text, match.end())
            found.append(WrittenCall(match.group(1), Arguments(value, text[match.end() : end])))
            previous_end = end
        except ValueError as exc:
            previous_end = match.end()  # where its arguments end is not known: a call may follow them
            rest = text[match.end() :].split("<｜tool▁call▁end｜>", 1)[0].split("```", 1)[0].strip()
            if cut:
                found.append(WrittenCall(match.group(1), Arguments(None, rest), "unparseable", CUT_OFF))
            else:
                found.append(WrittenCall(match.group(1), read_arguments(rest) if rest else Arguments(None, rest, json_error(exc))))
    return found


def _calls_as_python(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """Calls written as Python, a line each (Llama 3.2's `[read_file(path="a.py")]`, Gemma's ```tool_code):
    only a whole line that calls tools by name, with keyword arguments whose values are literals."""
    import ast

    found: list[WrittenCall] = []
    for fence in _fences(text):  # code shown in a ```python fence is code, not a call
        if fence.language.lower() not in _CALL_FENCE_LANGUAGES:
            text = text.replace(fence.body, "\n")
    for line in text.splitlines():
        line = line.strip()
        if not line or not re.match(r"\[?[\w.]+\(", line) or not line.rstrip(";").endswith((")", ")]")):
            continue
        try:
            tree = ast.parse(line.rstrip(";"), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        calls = tree.elts if isinstance(tree, ast.List) else [tree]
        if not calls or not all(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in known for c in calls):
            continue
        for call in calls:
            name = call.func.id  # type: ignore[union-attr]
            raw = ast.get_source_segment(line.rstrip(";"), call) or line
            if call.args:
                found.append(WrittenCall(name, Arguments(None, raw), "unparseable", "name every argument (path=\"a.py\"), or write the call as a JSON object"))
                continue
            try:
                arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg}
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                found.append(WrittenCall(name, Arguments(None, raw), "unparseable", "an argument is not a plain value (a string, number, list)"))
                continue
            found.append(WrittenCall(name, Arguments(arguments, raw)))
    return found


def _meant_as_a_call(body: str, known: set[str]) -> bool:
    """Whether a `<tool_call>` body starts as a call: JSON, a fence, `<function=`, or a tool's name first."""
    inner = body.strip()
    if inner.startswith(("{", "[", _FENCE_MARK, "<function=")):
        return True
    first = re.match(r"[\w.-]+", inner)
    return first is not None and first.group(0) in known


def _calls_in_tag(body: str, known: set[str], cut: bool, *, ends_the_answer: bool) -> list[WrittenCall]:
    """A `<tool_call>` body is surely meant as a call: if it cannot be read, say so."""
    inner = body.strip()
    fenced = _FENCE.match(inner)
    if fenced:
        fence, _ = _fence_at(inner, fenced)
        if fence.cut:
            return _cut_by_the_fence(fence.cut, known) or _unreadable_tag(fence.body, cut)
        inner = fence.body.strip()
    if inner.startswith("<function="):
        return _calls_in_function_tags(inner, known, cut, ends_the_answer=ends_the_answer)
    return _calls_in_block(inner, known, cut) or _unreadable_tag(inner, cut)


def _unreadable_tag(inner: str, cut: bool) -> list[WrittenCall]:
    guess = _NAME_IN_TEXT.search(inner)
    detail = CUT_OFF if cut else f"the <tool_call> body is not {_CALL_FORM}"
    return [WrittenCall(guess.group(1) if guess else "", Arguments(None, inner), "unparseable", detail)]


def _calls_in_fences(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    found: list[WrittenCall] = []
    for fence in _fences(text):
        if fence.language.lower() in _CALL_FENCE_LANGUAGES:
            body = fence.body[: fence.cut.start] if fence.cut else fence.body
            found.extend(_calls_in_block(body, known, cut) or _calls_in_bare_json(body, known, cut))
            found.extend(_cut_by_the_fence(fence.cut, known) if fence.cut else [])
    return found


@dataclass(frozen=True)
class _CutJson:
    """Invalid JSON in a fence's body that the ``` closing the fence cut inside one of its strings."""

    start: int  # where in the body it begins
    text: str
    error: str


@dataclass(frozen=True)
class _Fence:
    """One code fence's language and body."""

    language: str
    body: str
    cut: _CutJson | None = None


def _fences(text: str) -> Iterator[_Fence]:
    position = 0
    while (match := _FENCE.search(text, position)) is not None:
        fence, position = _fence_at(text, match)
        yield fence


def _fence_at(text: str, match: re.Match[str]) -> tuple[_Fence, int]:
    """The fence that `match` opens, and where the text after it starts.

    The regex ends a fence at the first ```, but a call that writes a README or a
    docstring holds ``` in its strings. So the JSON values starting the body's lines
    are decoded from the whole text first, and the fence ends at the first ``` after them.
    """
    language, start, close = match.group(1), match.start(2), match.end(2)
    if language.lower() not in _CALL_FENCE_LANGUAGES:  # ```python, ```c: code shown, never a call
        return _Fence(language, text[start:close]), min(close + len(_FENCE_MARK), len(text))
    position = start
    while (value := _JSON_START.search(text, position, close)) is not None:
        try:
            _, position = raw_decode(text, value.start(1))
        except ValueError as exc:
            # Only JSON quoted as JSON can be judged cut inside a string: a Python dict's
            # 'strings' may hold a lone ", which is no string of JSON's (27" wide).
            json_quoted = _DOUBLE_QUOTED_KEY.match(text, value.start(1)) is not None
            if close < len(text) and json_quoted and _ends_inside_a_string(text[value.start(1) : close]):
                cut = _CutJson(value.start(1) - start, text[value.start(1) : close], json_error(exc, value.start(1)))
                return _Fence(language, text[start:close], cut), close + len(_FENCE_MARK)
            position = value.end()
            continue
        if position > close:  # only a ``` inside a string can lie within valid JSON
            found = text.find(_FENCE_MARK, position)
            close = found if found >= 0 else len(text)
    return _Fence(language, text[start:close]), min(close + len(_FENCE_MARK), len(text))


def _ends_inside_a_string(json_text: str) -> bool:
    inside = escaped = False
    for char in json_text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = inside
        elif char == '"':
            inside = not inside
    return inside


def _cut_by_the_fence(cut: _CutJson, known: set[str]) -> list[WrittenCall]:
    """Repaired, such a call would run with its text cut at the ```: it is reported instead."""
    detail = (
        f"the call's JSON is not valid ({cut.error}), so the ``` inside one of its strings ended "
        "the code fence there; write the whole call again as valid JSON"
    )
    shapes = _call_shapes(repair(cut.text), known) or []
    return [WrittenCall(name, Arguments(None, cut.text), "unparseable", detail) for name, _ in shapes]


def _calls_in_function_tags(text: str, known: set[str], cut: bool, *, ends_the_answer: bool = True) -> list[WrittenCall]:
    """`<function=name>{json}</function>` or `<function=name><parameter=p>v</parameter></function>`. A last value
    that no tag closes, in a call that runs to the answer's end (`ends_the_answer`: `text` is all of it), is cut off."""
    found: list[WrittenCall] = []
    for name, body, closing in _FUNCTION_TAG.findall(text):
        if cut and not closing:
            found.append(WrittenCall(name, Arguments(None, body), "unparseable", CUT_OFF))
        elif "<parameter=" in body:
            parameters = _PARAMETER_TAG.findall(body)
            values = {key: value for key, value in parameters}
            if ends_the_answer and not closing and body.rfind("</parameter>") < body.rfind("<parameter="):
                last = parameters[-1][0] if parameters else ""  # none when the text stops inside the first one's name
                found.append(WrittenCall(name, Arguments(values, body, f"the answer ends inside <parameter={last}>", ends_mid_value=True)))
                continue
            found.append(WrittenCall(name, Arguments(values, body)))
        else:
            found.append(WrittenCall(name, read_arguments(body.strip())))
    return found


def _calls_in_bare_json(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """JSON objects starting a line, and those after them on the same line (`{...}; {...}`); one cut off at the end of
    a truncated answer counts too."""
    found: list[WrittenCall] = []
    resume = 0
    tries_left = [_MENDED_CALLS_TRIED]
    for match in _JSON_START.finditer(text):
        start = match.start(1)
        if start < resume:
            continue
        position = start
        while True:
            try:
                value, after = raw_decode(text, position)
            except ValueError as exc:
                if cut:
                    return found + _calls_in_block(text[position:], known, cut)
                # After a call on its line as on a line of its own: mended, read whole, or cut off, not dropped.
                calls, resume = _calls_in_unreadable_json(text, position, exc, known, tries_left)
                found.extend(calls)
            else:
                shapes = _written_from_value(value, text[position:after], "", known, cut)
                if position > start and not shapes:
                    break
                found.extend(shapes or [])
                resume = after
            # Llama 3 writes several calls on one line: `{...}; {...}`.
            more = _NEXT_ON_THE_LINE.match(text, resume)
            if more is None:
                break
            position = more.end()
    return found


def _calls_in_unreadable_json(
    text: str, start: int, exc: ValueError, known: set[str], tries_left: list[int]
) -> tuple[list[WrittenCall], int]:
    """The calls in the JSON at `start` that does not read, and where the text after them starts: read whole over
    several lines once mended (see _mended_call_from, _loose_call_from) while `tries_left[0]` allows (the answer's
    count, shared by all its lines, so a one-item list); one whose first line ends where a value goes on (`,` `:` `{`
    `[`) and that never closes, read to the text's end as its one-line twin is (run with its closing brackets added
    when only they are missing, else cut off or unreadable, see _unreadable_call_over_lines); else the rest of its
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
        calls = _unreadable_call_over_lines(text, start, exc, known)
        if calls:
            return calls, line_end
    calls = _calls_in_block(text[start:line_end], known, cut=False)
    if not calls and tried:
        calls = _unreadable_call_over_lines(text, start, exc, known)
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
    return _written_from_value(value, call_text, "", known, cut=False, repeated_key=loose_json.repeated_key(call_text)) or []


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


def _known_tool_named_at(text: str, start: int, known: set[str]) -> str | None:
    """The name the call starting at `start` gives as a quoted string on its first line, when it is a known tool's."""
    named = _LOOSE_CALL.match(text, start)
    name = named.group("name") if named is not None else None
    return name if name is not None and name.strip() in known else None


def _unreadable_call_over_lines(text: str, start: int, exc: ValueError, known: set[str]) -> list[WrittenCall]:
    """The call at `start` naming a known tool that does not read (`exc`: the error of reading the value at `start`) and
    gives no call otherwise (its first line gives none, `{` alone on it; or, pretty-printed and never closed, read whole
    it does not read; or it follows prose), as a broken call: cut off when the rest of the text stops inside a string
    or where a value was due (see call_arguments.text_ends_mid_value), else unreadable; [] when it names no tool (other
    JSON the model shows). Dropped, the model would be told it called no tool, not what to fix."""
    name = _known_tool_named_at(text, start, known)
    if name is None:
        return []
    rest = text[start:]
    rest_exc = _error_of_the_rest(rest, start, exc)
    if text_ends_mid_value(rest_exc, rest):
        return [WrittenCall(name, Arguments(None, rest, json_error(rest_exc), ends_mid_value=True))]
    closed = loose_json.value_end(text, start)
    raw = text[start:closed] if closed else rest
    detail = f"the call is not valid JSON ({json_error(exc, start)}); write it again as {_CALL_FORM}"
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


# What may stand between calls on one line: Llama 3's `; `, a comma, a space, nothing.
_NEXT_ON_THE_LINE = re.compile(r"[ \t]*[;,]?[ \t]*(?=[\[{])")


# Bare calls read whole once mended, at most, in one answer: each try reads the rest of the answer, and an
# answer of many broken call-like lines would take time quadratic in its length.
_MENDED_CALLS_TRIED = 8


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
        calls = _written_from_value(value, text[start:end_in_text], error, known, cut=False) if end_in_text else None
        return (calls, end_in_text) if calls and end_in_text else None
    # Mending adds and removes no line break: the call ends on the same line of `text`.
    line_end = start
    for _ in range(mended.count("\n", 0, end) + 1):
        line_end = text.find("\n", line_end + 1)
        if line_end < 0:
            line_end = len(text)
            break
    calls = _written_from_value(value, text[start:line_end], error, known, cut=False)
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
    ends; None when it closes on its first line, or never (see _calls_in_unreadable_json), or its reading is
    no valid JSON (the lines may be calls of their own, one lacking its brace), or is no call."""
    read = loose_json.value_as_json(text, start)
    if read is None:
        return None
    json_text, end = read
    try:
        value = loads(slips_mended(json_text))  # a regex's `\\d`, a trailing comma: slips mended as in double-quoted JSON
    except ValueError:
        return None
    calls = _written_from_value(value, json_text, "", known, cut=False, repeated_key=loose_json.repeated_key(text[start:end]))
    return (calls, end) if calls else None


def _single_quoted_call_after_prose(
    text: str, start: int, exc: ValueError, known: set[str], tries_left: list[int], reads_left: int, *, whole_only: bool
) -> tuple[list[WrittenCall], int | None, int]:
    """The calls in the single-quoted call at `start` (after words on its line), where the text after them starts (None
    when it never closes), and how much of the text the look for its end read. One that closes, only words after it on
    its line up to the next call, is read to there as a block (see _calls_in_block); one that never closes (it runs to
    the answer's end) is broken, cut off or unreadable, never run, as a double-quoted one is (see _calls_after_prose);
    else it is read as one starting a line is (see _calls_in_unreadable_json: repaired, broken or cut off), unless
    `whole_only` (it is inside one before it that never closes, already broken: only a whole call counts). Where a
    JSON5-like value closes is a guess (`'[{'id': 1}]\\n'` read as closing after `}]`): the words after it confirm it.
    While `reads_left` is spent the look is not made: each reads to the call's end, or the answer's, and a flood of calls
    that never close would take quadratic time."""
    read = 0
    if reads_left > 0:
        closed = loose_json.value_end(text, start)
        read = (closed if closed is not None else len(text)) - start
        if closed is None:  # inside one before it that never closes (`whole_only`), it is no call of its own to report
            return ([] if whole_only else _unreadable_call_over_lines(text, start, exc, known)), None, read
        next_call = _INLINE_CALL_EITHER_QUOTE.search(text, closed)
        words_end = next_call.start() if next_call is not None else len(text)
        line_end = text.find("\n", closed, words_end)
        if loose_json.only_words(text[closed : line_end if line_end >= 0 else words_end]):
            calls = _calls_in_block(text[start:closed], known, cut=False)
            if calls:
                return calls, closed, read
    if whole_only:
        return [], start, read
    calls, resume = _calls_in_unreadable_json(text, start, exc, known, tries_left)
    return calls, resume, read


def _calls_after_prose(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """Valid JSON calls of known tools that start inside a line, after some words.

    Only whole JSON naming a tool counts: prose that quotes some other JSON is not a call. In an answer cut at the
    length limit, a call is read with the array it is an item of (`[`, `{"tool_calls": [` before it), and the first
    JSON that does not read is read to the answer's end as a block is: a call in the value the limit cut is cut off,
    never run (its whole calls too, as at a line's start), nor dropped without a word. In an answer that ended as
    usual, the first call naming a known tool that does not read and never closes (it runs to the answer's end) is a
    broken call, cut off or unreadable (see _unreadable_call_over_lines), never run: dropped, the model would be told
    it had called no tool. One that closes, though not as JSON (a quote inside a string not escaped: `"print("hi")"`),
    is read as a block, as on a line of its own (see _calls_in_block): repaired, broken or cut off. So is a single-quoted
    one (`{'name': ...`, never JSON), or, where it closes is unsure, as one starting a line is (see
    _single_quoted_call_after_prose). A whole call after its start still runs; with none, calls written as Python lines
    (see _calls_as_python) are the answer's calls instead, when it has any.
    """
    found: list[WrittenCall] = []
    resume = 0
    single_quoted_tries = [_MENDED_CALLS_TRIED]  # as _calls_in_bare_json's: each reads over lines at most so many times
    # What the looks for where a broken call closes may read in all, double- and single-quoted alike: each reads to the call's
    # end, or the answer's, so a flood of calls that never close, each looked at, would take time quadratic in its length.
    # One budget in characters, linear, lets as many looks as the calls are short (at least _MENDED_CALLS_TRIED of them).
    reads_left = _MENDED_CALLS_TRIED * len(text)
    cut_off: list[WrittenCall] = []
    for match in _INLINE_CALL_EITHER_QUOTE.finditer(text):
        if match.start() < resume:
            continue
        start = match.start()
        single_quoted = match.group(1) == "'"
        if single_quoted and _known_tool_named_at(text, start, known) is None:
            continue  # some other JSON5-like value the model shows; unread (a failed read counts the lines before it)
        if cut:
            array = _ARRAY_BEFORE_A_CALL.search(text, max(resume, start - _ARRAY_OPENING_LIMIT), start)
            start = array.start() if array else start
        try:
            value, resume = raw_decode(text, start)
        except ValueError as exc:
            if cut:  # read once, not from each later call-like start: a flood of them would take quadratic time
                return found + _calls_in_block(text[start:], known, cut)
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
            if not cut_off and reads_left > 0 and _known_tool_named_at(text, start, known) is not None:
                closed = loose_json.value_end(text, start)
                reads_left -= (closed if closed is not None else len(text)) - start
                if closed is None:  # it runs to the answer's end: its last words are in it
                    cut_off = _unreadable_call_over_lines(text, start, exc, known)
                    found.extend(cut_off)  # a whole call after its start (inside it, as read) still runs, as before
                elif calls := _calls_in_block(text[start:closed], known, cut=False):
                    found.extend(calls)  # read as the same call on a line of its own is: repaired, broken or cut off
                    resume = closed
            continue
        shapes = _call_shapes(value, known) or []
        found.extend(WrittenCall(name, _arguments_of(arguments, "")) for name, arguments in shapes if name.strip() in known)
    if cut_off and len(found) == len(cut_off):
        # Only JSON that never closed, which may be the model's words showing a call's form: its calls written as Python
        # lines (`[read_file(path="a.py")]`) are the ones it made, as they were before such JSON was reported.
        return _calls_as_python(text, known, cut) or found
    return found


def _calls_in_block(block: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """The calls in one JSON block, or [] when the block is not shaped like a call. A block of several
    calls one after another (a line each, or `; ` between) is each of them: repaired as one value,
    all but the last would be lost."""
    block = block.strip()
    if not block.startswith(("{", "[")):
        return []
    try:
        value, error = loads(block), ""
    except ValueError as exc:
        walked, unread = values_one_after_another(block)
        several = values_all_whole(block, walked, unread)
        if len(several) > 1:
            written = [_written_from_value(one, raw, "", known, cut) for one, raw in several]
            if all(found is not None for found in written):
                return [call for found in written for call in found or ()]
        if not cut:
            split = _whole_calls_then_the_rest(block, walked, unread, known)
            if split:
                return split
        later_cut = cut_off_error(block, walked, unread)  # a second call cut off: the block's own error is "Extra data"
        (value, repeated), error = read_repaired(block), later_cut or json_error(exc)
        ends_mid_value = text_ends_mid_value(exc, block) or bool(later_cut)
        return _written_from_value(value, block, error, known, cut, ends_mid_value=ends_mid_value, repeated_key=repeated) or []
    return _written_from_value(value, block, error, known, cut) or []


def _whole_calls_then_the_rest(
    block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None, known: set[str]
) -> list[WrittenCall]:
    """The whole calls `block` starts with (`walked`), then the calls in the rest, read alone as a block of its own (mended,
    repaired or cut off as a single call is), or none when the rest is words (see loose_json.only_words: the model's, or a
    fence's ``` cut short) or a value cut off before it names a tool; [] when the values walked are not all calls, or the
    rest holds none. Repaired with the calls before it, the rest would be merged with them when their keys are the same,
    and those calls lost."""
    if not walked or unread is None:
        return []
    rest_text = block[unread[0] :]
    words_after = loose_json.only_words(rest_text)
    if not words_after and not rest_text.startswith(("{", "[")):
        return []
    whole = [_written_from_value(value, raw, "", known, cut=False) for value, raw in walked]
    if any(found is None for found in whole):
        return []
    calls = [call for found in whole for call in found or ()]
    if words_after:
        return calls
    rest = _calls_in_block(rest_text, known, cut=False)
    if not rest and loose_json.stops_mid_value(rest_text):
        return calls  # a value cut off before it names a tool (`{'`), as a bare one is dropped
    return calls + rest if rest else []


def _written_from_value(
    value: Any, raw: str, error: str, known: set[str], cut: bool, *, ends_mid_value: bool = False, repeated_key: str = ""
) -> list[WrittenCall] | None:
    shapes = _call_shapes(value, known)
    if shapes is None and error and cut:
        shapes = _call_shapes_before_an_unnamed_last(value, known)
    if shapes is None:
        return None
    if error and cut:
        return [WrittenCall(name, Arguments(None, raw), "unparseable", CUT_OFF) for name, _ in shapes]
    # The text stops in the last call: those before it in an array are whole (a burst whose last call was cut off).
    last = len(shapes) - 1
    # A key named twice anywhere in the value read loosely: no call of it can be trusted, as where its strings end is a guess.
    return [
        WrittenCall(name, _arguments_of(arguments, error, ends_mid_value and i == last, repeated_key))
        for i, (name, arguments) in enumerate(shapes)
    ]


def _call_shapes_before_an_unnamed_last(value: Any, known: set[str]) -> list[tuple[str, Any]] | None:
    """The calls of a list of calls (bare, or a `tool_calls` wrapper's) whose last item is no call, repaired from one cut
    off before it named its tool (`[{...}, {"na`): the calls before it, which the cut makes cut off too; else None."""
    if isinstance(value, dict) and set(value) == {"tool_calls"}:
        value = value["tool_calls"]
    return _call_shapes(value[:-1], known) if isinstance(value, list) else None


def _arguments_of(value: Any, error: str, ends_mid_value: bool = False, repeated_key: str = "") -> Arguments:
    if isinstance(value, str):
        parsed = read_arguments(value)
        return Arguments(
            parsed.value, value, parsed.json_error or error, parsed.ends_mid_value or ends_mid_value, parsed.repeated_key or repeated_key
        )
    return Arguments(value, json.dumps(value, ensure_ascii=False), error, ends_mid_value, repeated_key)


def _call_shapes(value: Any, known: set[str]) -> list[tuple[str, Any]] | None:
    """[(name, arguments)] when `value` is a call or a list of calls, else None."""
    if isinstance(value, list):
        shapes = [_call_shape(item, known) for item in value]
        if not shapes or any(shape is None for shape in shapes):
            return None
        return shapes  # type: ignore[return-value]
    if isinstance(value, dict) and set(value) == {"tool_calls"}:
        return _call_shapes(value["tool_calls"], known)
    shape = _call_shape(value, known)
    return [shape] if shape else None


_COMMENTARY_KEYS = {"thought", "thoughts", "thinking", "reasoning", "reason", "explanation", "comment"}


def _call_shape(value: Any, known: set[str]) -> tuple[str, Any] | None:
    """The accepted shapes; any other key means it is some other JSON, not a call."""
    if not isinstance(value, dict):
        return None
    keys = set(value) - {"id", "type"}
    inner = value.get("function")
    if keys == {"function"} and isinstance(inner, dict):
        return _call_shape(inner, known)
    for name_key, argument_keys in (
        ("name", ("arguments", "parameters")),
        ("tool", ("args", "arguments", "parameters")),
        ("function", ("arguments", "parameters", "args")),
    ):
        name = value.get(name_key)
        extra = keys - {name_key, *argument_keys}
        # A tool's call may carry the model's own words beside it ("thought"); other JSON may not.
        if not isinstance(name, str) or (extra and not (extra <= _COMMENTARY_KEYS and name.strip() in known)):
            continue
        present = [key for key in argument_keys if key in value]
        if len(present) == 1:
            return name, value[present[0]]
        # A bare {"name": ...} is a call only when it names a tool: {"name": "app"} is not one.
        if not present and name.strip() in known:
            return name, {}
    return None
