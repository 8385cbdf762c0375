"""Turn a model response into tool calls, checked against the tools' schemas.

Calls come natively (`response.tool_calls`) or, from small models that ignore
the tools API, written in the text: in `<tool_call>` tags, in a JSON code
fence, in `<function=name>` blocks, or as a bare JSON object. Every call either
fits a tool's parameters exactly and becomes a `ToolCall`, or becomes a
`BrokenCall` that says what is wrong, so the guards can count it and the
model can be told how to fix it. Nothing is coerced silently, except arguments
sent as a JSON string that encodes an object, and optional parameters given as null
(left out, as "not given" is meant).

This module is the entry and the check: it takes the native calls, or asks
orchestrator/written_calls.py for those written in the text (outside the thinking),
and fits each to its tool's schema. Both read a call's arguments text with
orchestrator/call_arguments.py (strict JSON, mended, read loosely, repaired, or found
cut off), which knows no call's form and no tool; written_calls.py (and the modules
it names for each form) knows no schema.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from orchestrator.call_arguments import CUT_OFF, Arguments, decode_string_object, read_arguments
from orchestrator.call_shapes import WrittenCall
from orchestrator.records import BrokenCall, ModelResponse, RawToolCall, ToolCall
from orchestrator.strict_json import MAX_JSON_DEPTH
from orchestrator.values_in_a_row import cut_off_error, values_all_whole, values_one_after_another
from orchestrator.written_calls import calls_in_text

# The parser's public names; MAX_JSON_DEPTH, the deepest a call's arguments may nest, is strict_json.py's.
__all__ = ["DESCRIBE_LIMIT", "MAX_JSON_DEPTH", "arguments_problem", "describe_call", "parse_calls", "thinking_apart"]

DESCRIBE_LIMIT = 120
_VALUE_LIMIT = 60
_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def parse_calls(response: ModelResponse, schemas: list[dict[str, Any]]) -> list[ToolCall | BrokenCall]:
    """Every call in `response`: native ones if any, else those written in the text (outside its thinking)."""
    tools = _parameters_by_name(schemas)
    cut = response.finish_reason == "length"
    if response.tool_calls:
        return [call for raw in response.tool_calls for call in _check_native(raw, tools, cut)]
    text, _ = thinking_apart(response.text)
    return [_check_written(found, tools) for found in calls_in_text(text, set(tools), cut)]


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


def _check_native(raw: RawToolCall, tools: dict[str, dict[str, Any]], cut: bool) -> list[ToolCall | BrokenCall]:
    """The native call, or a call for each argument object when its arguments hold several one after another."""
    name = raw.name.strip()
    early = _name_problem(name, tools)
    if early:
        return [BrokenCall(name=name, raw_arguments=raw.arguments, problem=early[0], detail=early[1], id=raw.id)]
    arguments = read_arguments(raw.arguments)
    if arguments.json_error and cut:
        return [BrokenCall(name=name, raw_arguments=raw.arguments, problem="unparseable", detail=CUT_OFF, id=raw.id)]
    several: list[Arguments] = []
    if arguments.json_error:
        several = _echoes_dropped(_argument_objects_one_after_another(raw.arguments) or _objects_repaired_apart(arguments))
    # The later ones have no id of the server's: the history gives each its own.
    return [_fit(name, one, tools[name], call_id=raw.id if i == 0 else "", source="native") for i, one in enumerate(several or [arguments])]


def _argument_objects_one_after_another(text: str) -> list[Arguments]:
    """The objects `text` holds one after another (a server that ran two calls' arguments together), read as a written
    block's calls are (see json_block_calls.calls_in_block): each whole one, mended if need be, and a last one that stops
    mid-value as cut off (see values_in_a_row.cut_off_error); [] when `text` holds no such run of two or more objects."""
    text = text.strip()
    walked, unread = values_one_after_another(text)
    several = values_all_whole(text, walked, unread)
    if len(several) > 1 and all(isinstance(value, dict) for value, _ in several):
        return [Arguments(value, raw) for value, raw in several]
    if unread is None or not walked or not all(isinstance(value, dict) for value, _ in walked):
        return []
    cut_error = cut_off_error(text, walked, unread)
    if cut_error:
        last = Arguments(None, text[unread[0] :], cut_error, ends_mid_value=True)
    elif text.startswith("{", unread[0]):  # read alone, as a single call's arguments are: the repair would merge it with those before
        last = read_arguments(text[unread[0] :])
        if not isinstance(last.value, dict):
            return []
    else:
        return []
    return [*(Arguments(value, raw) for value, raw in walked), last]


def _objects_repaired_apart(arguments: Arguments) -> list[Arguments]:
    """The objects the repair read apart in arguments that did not read one after another (a quote in their content not
    escaped: see call_arguments._every_object_kept), each with the arguments' JSON error; [] when it read one value."""
    if not isinstance(arguments.value, list) or not arguments.raw.lstrip().startswith("{"):
        return []
    return [Arguments(value, arguments.raw, arguments.json_error) for value in arguments.value]


def _echoes_dropped(objects: list[Arguments]) -> list[Arguments]:
    """The argument objects less what a streaming server echoes, which is no call: an empty `{}` beside a non-empty
    or cut one (a stream's opening delta, as Bedrock sends) and a copy of the object just before (the whole arguments
    sent again)."""
    any_filled = any(one.value != {} for one in objects)
    kept: list[Arguments] = []
    for one in objects:
        if (one.value == {} and any_filled) or (kept and one.value is not None and one.value == kept[-1].value):
            continue
        kept.append(one)
    return kept


def _check_written(found: WrittenCall, tools: dict[str, dict[str, Any]]) -> ToolCall | BrokenCall:
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
    name: str, arguments: Arguments, parameters: dict[str, Any], *, call_id: str, source: str
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
    if arguments.closes_early:
        # Repaired, the object ends where its content's quote was taken for a string's end: a write would run cut there.
        detail = (
            "the arguments are not valid JSON: their object closes before their end, and more follows it (a quote inside a"
            ' string, not escaped, may have ended it); write the whole call again, each such quote as \\"'
        )
        return BrokenCall(name, arguments.raw, "unparseable", detail, id=call_id, source=source)
    value = decode_string_object(arguments.value)
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


def _short_value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= _VALUE_LIMIT:
        return text
    return text[: _VALUE_LIMIT - 4] + ('..."' if isinstance(value, str) else "...")
