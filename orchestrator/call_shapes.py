"""The call a model wrote, as found in its text (`WrittenCall`), and which JSON values are calls: the shapes a call's
JSON takes (`{"name", "arguments"}`, `{"tool", "args"}`, `{"function": {...}}`, a list of them, a `tool_calls` wrapper)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.call_arguments import CUT_OFF, Arguments, read_arguments

# How a call is written, told to the model when one it wrote does not read.
CALL_FORM = 'a JSON object like {"name": "read_file", "arguments": {"path": "a.py"}}'


@dataclass(frozen=True)
class WrittenCall:
    """A call found in the text, not yet checked."""

    name: str
    arguments: Arguments
    # Set when the call cannot be read at all; `arguments` then holds only the raw text.
    problem: str = ""
    detail: str = ""


def written_from_value(
    value: Any, raw: str, error: str, known: set[str], cut: bool, *, ends_mid_value: bool = False, repeated_key: str = ""
) -> list[WrittenCall] | None:
    shapes = call_shapes(value, known)
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
        WrittenCall(name, arguments_of(arguments, error, ends_mid_value and i == last, repeated_key))
        for i, (name, arguments) in enumerate(shapes)
    ]


def _call_shapes_before_an_unnamed_last(value: Any, known: set[str]) -> list[tuple[str, Any]] | None:
    """The calls of a list of calls (bare, or a `tool_calls` wrapper's) whose last item is no call, repaired from one cut
    off before it named its tool (`[{...}, {"na`): the calls before it, which the cut makes cut off too; else None."""
    if isinstance(value, dict) and set(value) == {"tool_calls"}:
        value = value["tool_calls"]
    return call_shapes(value[:-1], known) if isinstance(value, list) else None


def arguments_of(value: Any, error: str, ends_mid_value: bool = False, repeated_key: str = "") -> Arguments:
    if isinstance(value, str):
        parsed = read_arguments(value)
        return Arguments(
            parsed.value, value, parsed.json_error or error, parsed.ends_mid_value or ends_mid_value, parsed.repeated_key or repeated_key
        )
    return Arguments(value, json.dumps(value, ensure_ascii=False), error, ends_mid_value, repeated_key)


def call_shapes(value: Any, known: set[str]) -> list[tuple[str, Any]] | None:
    """[(name, arguments)] when `value` is a call or a list of calls, else None."""
    if isinstance(value, list):
        shapes = [_call_shape(item, known) for item in value]
        if not shapes or any(shape is None for shape in shapes):
            return None
        return shapes  # type: ignore[return-value]
    if isinstance(value, dict) and set(value) == {"tool_calls"}:
        return call_shapes(value["tool_calls"], known)
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
