"""Turn a model response into tool calls, checked against the tools' schemas.

Calls come natively (`response.tool_calls`) or, from small models that ignore
the tools API, written in the text: in `<tool_call>` tags, in a JSON code
fence, in `<function=name>` blocks, or as a bare JSON object. Every call either
fits a tool's parameters exactly and becomes a `ToolCall`, or becomes a
`BrokenCall` that says what is wrong, so the guards can count it and the
model can be told how to fix it. Nothing is coerced silently, except arguments
sent as a JSON string that encodes an object, and optional parameters given as null
(left out, as "not given" is meant).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from orchestrator import loose_json
from orchestrator.loose_json import BETWEEN_VALUES
from orchestrator.records import BrokenCall, ModelResponse, RawToolCall, ToolCall
from orchestrator.surrogates import mend_all

DESCRIBE_LIMIT = 120
_VALUE_LIMIT = 60
_CUT_OFF = "cut off at the length limit"
# strict=False: a raw newline inside a string is unambiguous, and small models write them.
_DECODER = json.JSONDecoder(strict=False)
# Arguments never need more; deeper JSON is refused as unparseable rather than met by a RecursionError.
MAX_JSON_DEPTH = 64
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
# A call's JSON after a sentence on the same line ("I will read it. {"name": ...}").
_INLINE_CALL = re.compile(r'\{\s*"(?:name|tool|function)"\s*:')
# An array opened right before such a call, which the call is an item of: `[`, `{"tool_calls": [`.
_ARRAY_BEFORE_A_CALL = re.compile(r'(?:\{\s*"tool_calls"\s*:\s*)?\[\s*\Z')
_ARRAY_OPENING_LIMIT = 64  # how far before the call its array's opening is looked for: a bounded look, not back to the start
_CALL_FORM = 'a JSON object like {"name": "read_file", "arguments": {"path": "a.py"}}'
_NAME_IN_TEXT = re.compile(r'"(?:name|tool)"\s*:\s*"([^"]*)"')
_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class _Arguments:
    """Arguments as read: the value, and the JSON error if it only parsed after repair, and whether that error
    says the text ends in the middle of a value (see _ends_mid_value), and the key that the loose reading or the
    repair named twice in one object ("" for none: see loose_json.repeated_key)."""

    value: Any
    raw: str
    json_error: str = ""
    ends_mid_value: bool = False
    repeated_key: str = ""


def parse_calls(response: ModelResponse, schemas: list[dict[str, Any]]) -> list[ToolCall | BrokenCall]:
    """Every call in `response`: native ones if any, else those written in the text (outside its thinking)."""
    tools = _parameters_by_name(schemas)
    cut = response.finish_reason == "length"
    if response.tool_calls:
        return [call for raw in response.tool_calls for call in _check_native(raw, tools, cut)]
    text, _ = thinking_apart(response.text)
    return [_check_written(found, tools) for found in _calls_in_text(text, set(tools), cut)]


# Qwen3, QwQ and DeepSeek-R1 think in `<think>` tags before they answer, which a server without a reasoning
# parser leaves in the text; their chat templates may open the tag in the prompt, so only its end is there.
_THINKING_START = re.compile(r"\s*<(think|thinking)>", re.IGNORECASE)
_THINKING_END = re.compile(r"</(think|thinking)>", re.IGNORECASE)


def thinking_apart(text: str) -> tuple[str, str]:
    """`text` without its thinking, and that thinking: a `<think>` block at its start (to the end when cut
    off there), or all before a first `</think>` when the prompt held the opening tag; then each further
    block opened on a line of its own while the text before it is prose only (a second block after the
    first, a model that says a line and thinks again). A call the model only considered while thinking is
    not one it made. Other tags are the answer's own (a file being written may hold them): once a call
    may have begun (a bracket, a tag, a fence before the tag), they stay."""
    answer, thought = _first_thinking_apart(text)
    thoughts = [thought] if thought else []
    while (later := _THINKING_AFTER_PROSE.match(answer)) is not None:
        prose, rest = later.group(1), answer[later.start(2) :]
        rest, thought = _first_thinking_apart(rest)
        answer = (prose.rstrip() + "\n" + rest).strip()
        thoughts.append(thought)
    return answer, "\n".join(filter(None, thoughts))


# A thinking tag opening a line, after nothing but prose: no bracket, tag or fence a call's text could begin with.
_THINKING_AFTER_PROSE = re.compile(r"([^{\[<`]*?)(?:^|(?<=\n))[ \t]*(<(?:think|thinking)>)", re.IGNORECASE)


def _first_thinking_apart(text: str) -> tuple[str, str]:
    opened = _THINKING_START.match(text)
    if opened is not None:
        closed = re.compile(f"</{opened.group(1)}>", re.IGNORECASE).search(text, opened.end())
        if closed is None:
            return "", text[opened.end() :].strip()
        return text[closed.end() :].strip(), text[opened.end() : closed.start()].strip()
    closed = _THINKING_END.search(text)
    if closed is None or "<" + closed.group(1).lower() + ">" in text[: closed.start()].lower():
        return text, ""
    return text[closed.end() :].strip(), text[: closed.start()].strip()


def arguments_problem(parameters: dict[str, Any], arguments: Any) -> str:
    """Why `arguments` do not fit a JSON-schema `parameters` object; "" when they fit."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {_json_type(arguments)}"
    declared: dict[str, Any] = parameters.get("properties", {})
    # A parameter misnamed (`old_str` for `old`) is named first: "missing 'old'" alone takes two rounds to fix.
    for name in arguments:
        if name not in declared:
            takes = ", ".join(declared) or "no parameters"
            return f"unknown parameter {name!r} (takes: {takes})"
    for name in parameters.get("required", []):
        if name not in arguments:
            return f"missing required parameter {name!r}"
    for name, value in arguments.items():
        expected = declared[name].get("type")
        if expected and not _has_type(value, expected):
            wanted = expected if isinstance(expected, str) else " or ".join(expected)
            return f"parameter {name!r} must be {_article(wanted)} {wanted}, got {_json_type(value)}"
    return ""


def describe_call(call: ToolCall | BrokenCall, limit: int = DESCRIBE_LIMIT) -> str:
    """A short one-line form such as `read_file(path="a.py")`, for notes and signals."""
    if isinstance(call, ToolCall):
        inner = ", ".join(f"{key}={_short_value(value)}" for key, value in call.arguments.items())
    else:
        inner = " ".join(call.raw_arguments.split())
    text = f"{call.name or '?'}({inner})"
    return text if len(text) <= limit else text[: limit - 4] + "...)"


# --- checking one call -------------------------------------------------------


@dataclass(frozen=True)
class _Written:
    """A call found in the text, not yet checked."""

    name: str
    arguments: _Arguments
    # Set when the call cannot be read at all; `arguments` then holds only the raw text.
    problem: str = ""
    detail: str = ""


def _check_native(raw: RawToolCall, tools: dict[str, dict[str, Any]], cut: bool) -> list[ToolCall | BrokenCall]:
    """The native call, or a call for each argument object when its arguments hold several one after another."""
    name = raw.name.strip()
    early = _name_problem(name, tools)
    if early:
        return [BrokenCall(name=name, raw_arguments=raw.arguments, problem=early[0], detail=early[1], id=raw.id)]
    arguments = _read_arguments(raw.arguments)
    if arguments.json_error and cut:
        return [BrokenCall(name=name, raw_arguments=raw.arguments, problem="unparseable", detail=_CUT_OFF, id=raw.id)]
    several = _echoes_dropped(_argument_objects_one_after_another(raw.arguments)) if arguments.json_error else []
    # The later ones have no id of the server's: the history gives each its own.
    return [_fit(name, one, tools[name], call_id=raw.id if i == 0 else "", source="native") for i, one in enumerate(several or [arguments])]


def _argument_objects_one_after_another(text: str) -> list[_Arguments]:
    """The objects `text` holds one after another (a server that ran two calls' arguments together), read as a written
    block's calls are (see _calls_in_block): each whole one, mended if need be, and a last one that stops mid-value
    as cut off (see _cut_off_error); [] when `text` holds no such run of two or more objects."""
    text = text.strip()
    walked, unread = _values_one_after_another(text)
    several = _all_whole(text, walked, unread)
    if len(several) > 1 and all(isinstance(value, dict) for value, _ in several):
        return [_Arguments(value, raw) for value, raw in several]
    if unread is None or not walked or not all(isinstance(value, dict) for value, _ in walked):
        return []
    cut_error = _cut_off_error(text, walked, unread)
    if cut_error:
        last = _Arguments(None, text[unread[0] :], cut_error, ends_mid_value=True)
    elif text.startswith("{", unread[0]):  # read alone, as a single call's arguments are: the repair would merge it with those before
        last = _read_arguments(text[unread[0] :])
        if not isinstance(last.value, dict):
            return []
    else:
        return []
    return [*(_Arguments(value, raw) for value, raw in walked), last]


def _echoes_dropped(objects: list[_Arguments]) -> list[_Arguments]:
    """The argument objects less what a streaming server echoes, which is no call: an empty `{}` beside a non-empty
    or cut one (a stream's opening delta, as Bedrock sends) and a copy of the object just before (the whole arguments
    sent again)."""
    any_filled = any(one.value != {} for one in objects)
    kept: list[_Arguments] = []
    for one in objects:
        if (one.value == {} and any_filled) or (kept and one.value is not None and one.value == kept[-1].value):
            continue
        kept.append(one)
    return kept


def _check_written(found: _Written, tools: dict[str, dict[str, Any]]) -> ToolCall | BrokenCall:
    name = found.name.strip()
    raw = found.arguments.raw
    if found.problem:
        return BrokenCall(name=name, raw_arguments=raw, problem=found.problem, detail=found.detail, source="text")
    early = _name_problem(name, tools)
    if early:
        return BrokenCall(name=name, raw_arguments=raw, problem=early[0], detail=early[1], source="text")
    return _fit(name, found.arguments, tools[name], call_id="", source="text")


def _name_problem(name: str, tools: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    if not name:
        return "empty_tool_name", "the tool call has no tool name"
    if name not in tools:
        return "unknown_tool", f"there is no tool named {name!r}; the tools are {', '.join(tools)}"
    return None


def _fit(
    name: str, arguments: _Arguments, parameters: dict[str, Any], *, call_id: str, source: str
) -> ToolCall | BrokenCall:
    if arguments.ends_mid_value:
        detail = f"the arguments end in the middle of a value, as if cut off ({arguments.json_error}); write the whole call again"
        return BrokenCall(name, arguments.raw, "unparseable", detail, id=call_id, source=source)
    if arguments.repeated_key:
        # Strict JSON keeps the last of a repeated key; read loosely or repaired, the repeat is a quote inside a string's
        # content taken for its end, the content's own key (`'path': 'a.py'`) read as the arguments': a write to another file.
        detail = (
            f"the call is not valid JSON and, read as written, names the key {arguments.repeated_key!r} twice (a quote inside a"
            " string may have ended it); write the whole call again as JSON, its strings double-quoted"
        )
        return BrokenCall(name, arguments.raw, "unparseable", detail, id=call_id, source=source)
    value = _decode_string_object(arguments.value)
    if not isinstance(value, dict):
        detail = (
            f"arguments are not valid JSON: {arguments.json_error}"
            if arguments.json_error
            else f"arguments must be a JSON object, got {_json_type(value)}"
        )
        return BrokenCall(name, arguments.raw, "unparseable", detail, id=call_id, source=source)
    value = _without_nulls_for_options(parameters, value)
    reason = arguments_problem(parameters, value)
    if reason:
        if arguments.json_error:
            reason = f"arguments are not valid JSON ({arguments.json_error}); even repaired: {reason}"
        return BrokenCall(name, arguments.raw, "invalid", reason, id=call_id, source=source)
    return ToolCall(name=name, arguments=value, id=call_id, source=source)


def _without_nulls_for_options(parameters: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` without the optional parameters given as null: many small models fill in every
    parameter they see, null meaning "not given", which is what leaving it out says."""
    declared, required = parameters.get("properties", {}), set(parameters.get("required", []))

    def takes_null(name: str) -> bool:
        kind = declared[name].get("type") if isinstance(declared[name], dict) else None
        return kind == "null" or (isinstance(kind, list) and "null" in kind)

    return {
        name: value for name, value in arguments.items()
        if not (value is None and name in declared and name not in required and not takes_null(name))
    }


def _read_arguments(text: str) -> _Arguments:
    """Parse arguments JSON; if it is not valid, keep the repaired value and the error. Arguments cut off mid-value
    are never run, so they are not repaired: the repair library is quadratic on some garbage (64 kB of `{'` took
    minutes), and what it would make of them is thrown away."""
    if not text.strip():
        return _Arguments({}, text)
    try:
        return _Arguments(_loads(text), text)
    except ValueError as exc:
        if _ends_mid_value(exc, text):
            return _Arguments(None, text, _json_error(exc), ends_mid_value=True)
        value, repeated = _repaired(text)
        return _Arguments(value, text, _json_error(exc), repeated_key=repeated)


def _ends_mid_value(exc: ValueError, text: str) -> bool:
    """Whether `text`, whose JSON failed with `exc`, stops inside a string or where a value was due: cut off, though not at
    the length limit (a server's own cap, a model that stopped). Repaired, its last value would be half of
    what was meant, or one the repair made up (`"new": ` read as `""`, an edit that deletes), and run as such.
    One that lacks only its closing brackets, every value whole, is a slip the repair may mend."""
    if not isinstance(exc, json.JSONDecodeError):
        return False
    if _stops_mid_value(exc, text):
        return True
    # The error may be a slip the repair mends first (a regex's `\d`, a trailing comma), before where the text stops.
    mended = _mended(text)
    if mended != text:
        try:
            _loads(mended)
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


def _repaired(text: str) -> tuple[Any, str]:
    """`text`'s value after repair, and the key its reading names twice (see loose_json.repeated_key; "" when mended to
    strict JSON, which keeps the last): first of the two slips small models make most (a backslash JSON does
    not know: a regex's `\\d` written as is; a comma before a closing bracket) mended exactly; then, when
    `text` is one JSON5-like object or array (single quotes, bare keys, the model's words after it, closing
    brackets missing though every value is whole), that value read loosely; the repair library only for the
    rest, since it reads an apostrophe inside a single-quoted string (`'it's done'`) as its end (and strips the
    line breaks that end a string, which _repair puts back)."""
    mended = _mended(text)
    if mended != text:
        try:
            return _loads(mended), ""
        except ValueError:
            pass
    loose = _read_loosely(text)
    return (loose if loose is not None else _repair(text)), loose_json.repeated_key(text)


def _read_loosely(text: str) -> Any:
    """`text`'s only object or array, written as JSON by loose_json (its open brackets closed when every value is
    whole), its slips mended, then parsed strictly; None when `text` holds no such value or that does not parse."""
    start = len(text) - len(text.lstrip())
    json_text = loose_json.only_value_as_json(text, start) if text.startswith(("{", "["), start) else None
    if json_text is None:
        return None
    try:
        return _loads(_mended(json_text))
    except ValueError:
        return None


def _mended(text: str) -> str:
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


def _repair(text: str) -> Any:
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
    marked_text = _LINE_BREAK_BEFORE_A_CLOSING_QUOTE.sub(_END_MARK, text)
    if marked_text == text or _END_MARK in text:
        return repaired
    marked = _library_repair(_ReadOnABudget(marked_text))
    if marked is None or json.dumps(_ends_changed(marked, _stripped)) != json.dumps(repaired):
        return repaired
    return _ends_changed(marked, _unmarked)


# Written where a string's white space ends in a line break before its closing quote: a character no model writes
# (private use), which the repair library keeps as the string's last, not white space it strips.
_END_MARK = "\ue000"
# A quote after a line break (raw or the escape `\n`), then what may follow a value: a comma, a closing bracket, the end.
_LINE_BREAK_BEFORE_A_CLOSING_QUOTE = re.compile(r"""(?:(?<=\n)|(?<=\\n))(?=['"]\s*(?:[,}\]]|\Z))""")
# The characters the repair library may read of a marked text: a long one it reads at once is read 2 to 4 times per
# character (a short one up to 11 times, a few hundred reads), one it goes quadratic on thousands of times.
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


def _decode_string_object(value: Any) -> Any:
    """Arguments sent as a JSON string that encodes an object: the one coercion allowed."""
    if value is None:
        return {}
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            decoded = _loads(value)
        except ValueError:
            return value
        if isinstance(decoded, dict):
            return decoded
    return value


# --- finding calls in text ---------------------------------------------------


def _calls_in_text(text: str, known: set[str], cut: bool) -> list[_Written]:
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


def _calls_after_names(text: str, known: set[str], cut: bool) -> list[_Written]:
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


def _calls_in_deepseek_tokens(text: str, known: set[str], cut: bool) -> list[_Written]:
    return _calls_named_before_json(_DEEPSEEK_CALL, text, cut)


def _calls_named_before_json(form: re.Pattern[str], text: str, cut: bool, where: Any = None) -> list[_Written]:
    """Calls written as a name `form` matches, followed by the arguments' JSON; not a match inside the
    arguments of the call before it, nor one `where(text, match, previous_end)` refuses."""
    found: list[_Written] = []
    previous_end = -1
    for match in form.finditer(text):
        if match.start() < previous_end:
            continue  # inside the call before: its arguments' text
        if where is not None and not where(text, match, previous_end):
            continue
        try:
            value, end = _raw_decode(text, match.end())
            found.append(_Written(match.group(1), _Arguments(value, text[match.end() : end])))
            previous_end = end
        except ValueError as exc:
            previous_end = match.end()  # where its arguments end is not known: a call may follow them
            rest = text[match.end() :].split("<｜tool▁call▁end｜>", 1)[0].split("```", 1)[0].strip()
            if cut:
                found.append(_Written(match.group(1), _Arguments(None, rest), "unparseable", _CUT_OFF))
            else:
                found.append(_Written(match.group(1), _read_arguments(rest) if rest else _Arguments(None, rest, _json_error(exc))))
    return found


def _calls_as_python(text: str, known: set[str], cut: bool) -> list[_Written]:
    """Calls written as Python, a line each (Llama 3.2's `[read_file(path="a.py")]`, Gemma's ```tool_code):
    only a whole line that calls tools by name, with keyword arguments whose values are literals."""
    import ast

    found: list[_Written] = []
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
                found.append(_Written(name, _Arguments(None, raw), "unparseable", "name every argument (path=\"a.py\"), or write the call as a JSON object"))
                continue
            try:
                arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg}
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                found.append(_Written(name, _Arguments(None, raw), "unparseable", "an argument is not a plain value (a string, number, list)"))
                continue
            found.append(_Written(name, _Arguments(arguments, raw)))
    return found


def _meant_as_a_call(body: str, known: set[str]) -> bool:
    """Whether a `<tool_call>` body starts as a call: JSON, a fence, `<function=`, or a tool's name first."""
    inner = body.strip()
    if inner.startswith(("{", "[", _FENCE_MARK, "<function=")):
        return True
    first = re.match(r"[\w.-]+", inner)
    return first is not None and first.group(0) in known


def _calls_in_tag(body: str, known: set[str], cut: bool, *, ends_the_answer: bool) -> list[_Written]:
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


def _unreadable_tag(inner: str, cut: bool) -> list[_Written]:
    guess = _NAME_IN_TEXT.search(inner)
    detail = _CUT_OFF if cut else f"the <tool_call> body is not {_CALL_FORM}"
    return [_Written(guess.group(1) if guess else "", _Arguments(None, inner), "unparseable", detail)]


def _calls_in_fences(text: str, known: set[str], cut: bool) -> list[_Written]:
    found: list[_Written] = []
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
            _, position = _raw_decode(text, value.start(1))
        except ValueError as exc:
            # Only JSON quoted as JSON can be judged cut inside a string: a Python dict's
            # 'strings' may hold a lone ", which is no string of JSON's (27" wide).
            json_quoted = _DOUBLE_QUOTED_KEY.match(text, value.start(1)) is not None
            if close < len(text) and json_quoted and _ends_inside_a_string(text[value.start(1) : close]):
                cut = _CutJson(value.start(1) - start, text[value.start(1) : close], _json_error(exc, value.start(1)))
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


def _cut_by_the_fence(cut: _CutJson, known: set[str]) -> list[_Written]:
    """Repaired, such a call would run with its text cut at the ```: it is reported instead."""
    detail = (
        f"the call's JSON is not valid ({cut.error}), so the ``` inside one of its strings ended "
        "the code fence there; write the whole call again as valid JSON"
    )
    shapes = _call_shapes(_repair(cut.text), known) or []
    return [_Written(name, _Arguments(None, cut.text), "unparseable", detail) for name, _ in shapes]


def _calls_in_function_tags(text: str, known: set[str], cut: bool, *, ends_the_answer: bool = True) -> list[_Written]:
    """`<function=name>{json}</function>` or `<function=name><parameter=p>v</parameter></function>`. A last value
    that no tag closes, in a call that runs to the answer's end (`ends_the_answer`: `text` is all of it), is cut off."""
    found: list[_Written] = []
    for name, body, closing in _FUNCTION_TAG.findall(text):
        if cut and not closing:
            found.append(_Written(name, _Arguments(None, body), "unparseable", _CUT_OFF))
        elif "<parameter=" in body:
            parameters = _PARAMETER_TAG.findall(body)
            values = {key: value for key, value in parameters}
            if ends_the_answer and not closing and body.rfind("</parameter>") < body.rfind("<parameter="):
                last = parameters[-1][0] if parameters else ""  # none when the text stops inside the first one's name
                found.append(_Written(name, _Arguments(values, body, f"the answer ends inside <parameter={last}>", ends_mid_value=True)))
                continue
            found.append(_Written(name, _Arguments(values, body)))
        else:
            found.append(_Written(name, _read_arguments(body.strip())))
    return found


def _calls_in_bare_json(text: str, known: set[str], cut: bool) -> list[_Written]:
    """JSON objects starting a line, and those after them on the same line (`{...}; {...}`); one cut off at the end of
    a truncated answer counts too."""
    found: list[_Written] = []
    resume = 0
    tries_left = [_MENDED_CALLS_TRIED]
    for match in _JSON_START.finditer(text):
        start = match.start(1)
        if start < resume:
            continue
        position = start
        while True:
            try:
                value, after = _raw_decode(text, position)
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
) -> tuple[list[_Written], int]:
    """The calls in the JSON at `start` that does not read, and where the text after them starts: read whole over
    several lines once mended (see _mended_call_from, _loose_call_from) while `tries_left[0]` allows (the answer's
    count, shared by all its lines, so a one-item list); one whose first line ends where a value goes on (`,` `:` `{`
    `[`) and that never closes, read to the text's end as its one-line twin is (run with its closing brackets added
    when only they are missing, else cut off or unreadable, see _unreadable_call_over_lines); else the rest of its
    line as a block (repaired, or cut off)."""
    tried = bool(tries_left[0]) and _LOOSE_CALL.match(text, start) is not None  # not a `{` of code, or other JSON
    if tried:
        tries_left[0] -= 1
        mended = _mended_call_from(text, start, _json_error(exc, start), known) if _INLINE_CALL.match(text, start) else None
        mended = mended or _loose_call_from(text, start, known)
        if mended is not None:
            return mended
    line_end = text.find("\n", start)
    line_end = line_end if line_end >= 0 else len(text)
    if tried and line_end < len(text) and _goes_on_and_never_closes(text, start, line_end):
        # Its first line alone (`{'name': 'write_file',`) would be a call without arguments: read whole, it is as its
        # one-line twin is, cut off when it stops mid-value, else run with its closing brackets added. Not when a later
        # line starts a call: cut where a value was due, it would take that call for the value, and lose it.
        if not _ends_mid_value(_error_of_the_rest(text[start:], start, exc), text[start:]) and (
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


def _call_lacking_only_closing_brackets(text: str, start: int, known: set[str]) -> list[_Written]:
    """The calls of the value at `start` read to the text's end with its closing brackets added, when it lacks only
    them, every value whole (see loose_json.only_value_as_json), and reads so; else [], as when the text ends after a
    comma (more was to come: `{\n "name": "list_dir",` is no call without arguments) or on a quote that may not end
    its last string (see _ends_on_a_quote_that_may_not_close: a write would be run with its content cut off)."""
    if text.rstrip().endswith(",") or _ends_on_a_quote_that_may_not_close(text):
        return []
    call_text = text[start:]
    value = _read_loosely(call_text)
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
    return text.endswith('"') and len(_UNESCAPED_DOUBLE_QUOTE.findall(last_line)) % 2 == 1


_UNESCAPED_DOUBLE_QUOTE = re.compile(r'(?<!\\)(?:\\\\)*"')


def _known_tool_named_at(text: str, start: int, known: set[str]) -> str | None:
    """The name the call starting at `start` gives as a quoted string on its first line, when it is a known tool's."""
    named = _LOOSE_CALL.match(text, start)
    name = named.group("name") if named is not None else None
    return name if name is not None and name.strip() in known else None


def _unreadable_call_over_lines(text: str, start: int, exc: ValueError, known: set[str]) -> list[_Written]:
    """The call at `start` naming a known tool that does not read (`exc`: the error of reading the value at `start`) and
    gives no call otherwise (its first line gives none, `{` alone on it; or, pretty-printed and never closed, read whole
    it does not read; or it follows prose), as a broken call: cut off when the rest of the text stops inside a string
    or where a value was due (see _ends_mid_value), else unreadable; [] when it names no tool (other JSON the model
    shows). Dropped, the model would be told it called no tool, not what to fix."""
    name = _known_tool_named_at(text, start, known)
    if name is None:
        return []
    rest = text[start:]
    rest_exc = _error_of_the_rest(rest, start, exc)
    if _ends_mid_value(rest_exc, rest):
        return [_Written(name, _Arguments(None, rest, _json_error(rest_exc), ends_mid_value=True))]
    closed = loose_json.value_end(text, start)
    raw = text[start:closed] if closed else rest
    detail = f"the call is not valid JSON ({_json_error(exc, start)}); write it again as {_CALL_FORM}"
    return [_Written(name, _Arguments(None, raw), "unparseable", detail)]


def _error_of_the_rest(rest: str, start: int, exc: ValueError) -> ValueError:
    """The error of parsing `rest` (the text from `start`) strictly as one value, from `exc`, the error of reading the
    value at `start`: the decoder's own error is the same, its place counted from `start`. Only an error of ours (the
    value read whole, then refused as nested too deeply) says nothing of what follows it, so then `rest` is parsed."""
    if isinstance(exc, json.JSONDecodeError):
        return json.JSONDecodeError(exc.msg, rest, exc.pos - start)
    try:
        _loads(rest)
    except ValueError as rest_exc:
        return rest_exc
    return exc  # never reached: what did not read at `start` does not read as all of `rest`


# What may stand between calls on one line: Llama 3's `; `, a comma, a space, nothing.
_NEXT_ON_THE_LINE = re.compile(r"[ \t]*[;,]?[ \t]*(?=[\[{])")


# Bare calls read whole once mended, at most, in one answer: each try reads the rest of the answer, and an
# answer of many broken call-like lines would take time quadratic in its length.
_MENDED_CALLS_TRIED = 8


def _mended_call_from(text: str, start: int, error: str, known: set[str]) -> tuple[list[_Written], int] | None:
    """The call whose JSON starts at `start` and reads whole once mended (a stray backslash, a trailing comma),
    over as many lines as it takes (pretty-printed, a string with raw newlines), and where the line it ends on
    ends, or, when it ends on its first line, where it ends there (the calls after it on the line are read too);
    None when it does not read so. (Its first line alone would be a call cut inside a string.)"""
    mended = _mended(text[start:])
    try:
        value, end = _raw_decode(mended, 0)
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


def _loose_call_from(text: str, start: int, known: set[str]) -> tuple[list[_Written], int] | None:
    """The JSON5-like call at `start` (single quotes, bare keys) over several lines (pretty-printed, or its strings
    holding raw line breaks), read whole to its closing bracket, as JSON (see loose_json.value_as_json), and where it
    ends; None when it closes on its first line, or never (see _calls_in_unreadable_json), or its reading is
    no valid JSON (the lines may be calls of their own, one lacking its brace), or is no call."""
    read = loose_json.value_as_json(text, start)
    if read is None:
        return None
    json_text, end = read
    try:
        value = _loads(_mended(json_text))  # a regex's `\\d`, a trailing comma: slips mended as in double-quoted JSON
    except ValueError:
        return None
    calls = _written_from_value(value, json_text, "", known, cut=False, repeated_key=loose_json.repeated_key(text[start:end]))
    return (calls, end) if calls else None


def _calls_after_prose(text: str, known: set[str], cut: bool) -> list[_Written]:
    """Valid JSON calls of known tools that start inside a line, after some words.

    Only whole JSON naming a tool counts: prose that quotes some other JSON is not a call. In an answer cut at the
    length limit, a call is read with the array it is an item of (`[`, `{"tool_calls": [` before it), and the first
    JSON that does not read is read to the answer's end as a block is: a call in the value the limit cut is cut off,
    never run (its whole calls too, as at a line's start), nor dropped without a word. In an answer that ended as
    usual, the first call naming a known tool that does not read and never closes (it runs to the answer's end) is a
    broken call, cut off or unreadable (see _unreadable_call_over_lines), never run: dropped, the model would be told
    it had called no tool. A whole call after its start still runs; with none, calls written as Python lines (see
    _calls_as_python) are the answer's calls instead, when it has any.
    """
    found: list[_Written] = []
    resume = 0
    ends_looked_for = _MENDED_CALLS_TRIED
    cut_off: list[_Written] = []
    for match in _INLINE_CALL.finditer(text):
        if match.start() < resume:
            continue
        start = match.start()
        if cut:
            array = _ARRAY_BEFORE_A_CALL.search(text, max(resume, start - _ARRAY_OPENING_LIMIT), start)
            start = array.start() if array else start
        try:
            value, resume = _raw_decode(text, start)
        except ValueError as exc:
            if cut:  # read once, not from each later call-like start: a flood of them would take quadratic time
                return found + _calls_in_block(text[start:], known, cut)
            if not cut_off and ends_looked_for and _known_tool_named_at(text, start, known) is not None:
                ends_looked_for -= 1  # each look reads to the call's end, or the answer's: a flood would take quadratic time
                if loose_json.value_end(text, start) is None:  # it runs to the answer's end: its last words are in it
                    cut_off = _unreadable_call_over_lines(text, start, exc, known)
                    found.extend(cut_off)  # a whole call after its start (inside it, as read) still runs, as before
            continue
        shapes = _call_shapes(value, known) or []
        found.extend(_Written(name, _arguments_of(arguments, "")) for name, arguments in shapes if name.strip() in known)
    if cut_off and len(found) == len(cut_off):
        # Only JSON that never closed, which may be the model's words showing a call's form: its calls written as Python
        # lines (`[read_file(path="a.py")]`) are the ones it made, as they were before such JSON was reported.
        return _calls_as_python(text, known, cut) or found
    return found


def _calls_in_block(block: str, known: set[str], cut: bool) -> list[_Written]:
    """The calls in one JSON block, or [] when the block is not shaped like a call. A block of several
    calls one after another (a line each, or `; ` between) is each of them: repaired as one value,
    all but the last would be lost."""
    block = block.strip()
    if not block.startswith(("{", "[")):
        return []
    try:
        value, error = _loads(block), ""
    except ValueError as exc:
        walked, unread = _values_one_after_another(block)
        several = _all_whole(block, walked, unread)
        if len(several) > 1:
            written = [_written_from_value(one, raw, "", known, cut) for one, raw in several]
            if all(found is not None for found in written):
                return [call for found in written for call in found or ()]
        if not cut:
            split = _whole_calls_then_the_rest(block, walked, unread, known)
            if split:
                return split
        later_cut = _cut_off_error(block, walked, unread)  # a second call cut off: the block's own error is "Extra data"
        (value, repeated), error = _repaired(block), later_cut or _json_error(exc)
        ends_mid_value = _ends_mid_value(exc, block) or bool(later_cut)
        return _written_from_value(value, block, error, known, cut, ends_mid_value=ends_mid_value, repeated_key=repeated) or []
    return _written_from_value(value, block, error, known, cut) or []


def _whole_calls_then_the_rest(
    block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None, known: set[str]
) -> list[_Written]:
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


def _values_one_after_another(block: str) -> tuple[list[tuple[Any, str]], tuple[int, ValueError] | None]:
    """The JSON values `block` holds one after another, each with its text, up to the first that does not read, as JSON
    or as a JSON5-like value (see _json5_like_value_at), and where that one starts with its JSON error (None when all of
    `block` reads)."""
    values: list[tuple[Any, str]] = []
    position = 0
    while position < len(block):
        try:
            value, end = _raw_decode(block, position)
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
    JSON with its slips mended (see _read_loosely): the repair would merge it with the values beside it, or end a
    single-quoted string at an apostrophe. None when it does not close, or its reading does not parse or names a key twice
    (then read with the rest, its calls are broken: see loose_json.repeated_key)."""
    read = loose_json.closed_value_as_json(text, start) if text.startswith(("{", "["), start) else None
    if read is None or loose_json.repeated_key(text[start : read[1]]):
        return None
    json_text, end = read
    try:
        return _loads(_mended(json_text)), end
    except ValueError:
        return None


def _all_whole(block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None) -> list[tuple[Any, str]]:
    """The values `block` holds one after another when all of it reads (`walked`, with `unread` None), or, when that
    gives fewer than two, all of it once mended (one of them wrote a regex's `\\d` or a trailing comma); else []."""
    several = walked if unread is None else []
    if len(several) < 2:
        mended, unread_mended = _values_one_after_another(_mended(block))
        several = mended if unread_mended is None else []
    return several


def _cut_off_error(block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None) -> str:
    """The JSON error of `block`'s first value that does not read (`unread`, after the values `walked`), when it and
    every value before it is an object or array (calls, not the model's words after them) and it stops inside a string
    or where a value was due (see _ends_mid_value); else ""."""
    if unread is None or any(raw[0] not in "{[" for raw in (block[unread[0]], *(raw for _, raw in walked))):
        return ""
    exc = unread[1]
    return _json_error(exc) if _ends_mid_value(exc, block) else ""


def _written_from_value(
    value: Any, raw: str, error: str, known: set[str], cut: bool, *, ends_mid_value: bool = False, repeated_key: str = ""
) -> list[_Written] | None:
    shapes = _call_shapes(value, known)
    if shapes is None and error and cut:
        shapes = _call_shapes_before_an_unnamed_last(value, known)
    if shapes is None:
        return None
    if error and cut:
        return [_Written(name, _Arguments(None, raw), "unparseable", _CUT_OFF) for name, _ in shapes]
    # The text stops in the last call: those before it in an array are whole (a burst whose last call was cut off).
    last = len(shapes) - 1
    # A key named twice anywhere in the value read loosely: no call of it can be trusted, as where its strings end is a guess.
    return [
        _Written(name, _arguments_of(arguments, error, ends_mid_value and i == last, repeated_key))
        for i, (name, arguments) in enumerate(shapes)
    ]


def _call_shapes_before_an_unnamed_last(value: Any, known: set[str]) -> list[tuple[str, Any]] | None:
    """The calls of a list of calls (bare, or a `tool_calls` wrapper's) whose last item is no call, repaired from one cut
    off before it named its tool (`[{...}, {"na`): the calls before it, which the cut makes cut off too; else None."""
    if isinstance(value, dict) and set(value) == {"tool_calls"}:
        value = value["tool_calls"]
    return _call_shapes(value[:-1], known) if isinstance(value, list) else None


def _arguments_of(value: Any, error: str, ends_mid_value: bool = False, repeated_key: str = "") -> _Arguments:
    if isinstance(value, str):
        parsed = _read_arguments(value)
        return _Arguments(
            parsed.value, value, parsed.json_error or error, parsed.ends_mid_value or ends_mid_value, parsed.repeated_key or repeated_key
        )
    return _Arguments(value, json.dumps(value, ensure_ascii=False), error, ends_mid_value, repeated_key)


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


# --- small helpers -----------------------------------------------------------


def _parameters_by_name(schemas: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for schema in schemas:
        function = schema.get("function", schema)
        tools[function["name"]] = function.get("parameters") or {"type": "object", "properties": {}}
    return tools


def _has_type(value: Any, expected: str | list[str]) -> bool:
    for name in [expected] if isinstance(expected, str) else expected:
        python_types = _JSON_TYPES.get(name)
        if python_types is None:
            return True  # a type we do not know is not ours to reject
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, python_types):
            return True
    return False


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for name in ("boolean", "integer", "number", "string", "array", "object"):
        if isinstance(value, _JSON_TYPES[name]):
            return name
    return type(value).__name__


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _loads(text: str) -> Any:
    return _raw_decode(text, 0, whole=True)[0]


def _raw_decode(text: str, start: int, *, whole: bool = False) -> tuple[Any, int]:
    """The JSON value at `start` (or, if `whole`, all of `text`), with JSON nested too deeply to read or
    to use (json's recursion, our guards' own) refused as a ValueError, like any other unreadable JSON."""
    try:
        value, end = (_DECODER.decode(text), len(text)) if whole else _DECODER.raw_decode(text, start)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    if _nested_deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    # Only a \u escape in the JSON can have made half a surrogate pair (see orchestrator/surrogates.py).
    return (mend_all(value) if text.find("\\u", start, end) >= 0 else value), end


def _nested_deeper_than(value: Any, limit: int) -> bool:
    level = [value]
    for _ in range(limit + 1):
        level = [item for node in level if isinstance(node, (dict, list)) for item in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return False
    return True


def _json_error(exc: ValueError, start: int = 0) -> str:
    """The error's message, its place counted from `start`, where the JSON began."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at char {exc.pos - start}"
    return str(exc)


def _short_value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= _VALUE_LIMIT:
        return text
    return text[: _VALUE_LIMIT - 4] + ('..."' if isinstance(value, str) else "...")
