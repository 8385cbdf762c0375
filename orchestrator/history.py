"""How a model's turn is written into the conversation it will see next.

Two rules come from real servers: a tool call whose arguments did not parse is
never sent back as a tool call (llama.cpp answers HTTP 500 to its own broken
JSON in history), and reminders ride on the next request only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from orchestrator.protocols import Message
from orchestrator.records import BrokenCall, ModelResponse, ToolCall, ToolResult

_PROBLEMS = {
    "unparseable": "its arguments are not valid JSON",
    "invalid": "its arguments do not fit the tool's parameters",
}


@dataclass(frozen=True)
class AssistantTurn:
    assistant: Message
    # id(call) -> tool_call_id, for the native calls that go back as tool calls.
    ids: dict[int, str]


def assistant_turn(response: ModelResponse, calls: Sequence[ToolCall | BrokenCall], turn: int) -> AssistantTurn:
    native = [c for c in calls if isinstance(c, ToolCall) and c.source == "native"]
    ids = {id(call): call.id or f"call_{turn}_{index}" for index, call in enumerate(native)}
    message: Message = {"role": "assistant", "content": response.text or ""}
    if not response.text and any(isinstance(c, BrokenCall) for c in calls):
        message["content"] = "(I tried to call a tool, but the call could not be used.)"
    if native:
        message["tool_calls"] = [
            {
                "id": ids[id(call)],
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in native
        ]
    return AssistantTurn(assistant=message, ids=ids)


def tool_message(tool_call_id: str, result: ToolResult) -> Message:
    return {"role": "tool", "tool_call_id": tool_call_id, "content": result.output}


def text_call_result(call: ToolCall, result: ToolResult) -> str:
    status = "ok" if result.ok else "failed"
    return f"Result of {call.name} ({status}):\n{result.output}"


def broken_call_note(call: BrokenCall, tool_names: Sequence[str]) -> str:
    available = ", ".join(tool_names)
    if call.problem == "empty_tool_name":
        return f"Your tool call had no tool name. Call one of: {available}."
    if call.problem == "unknown_tool":
        return f"There is no tool named {call.name!r}. The tools you have are: {available}."
    what = _PROBLEMS.get(call.problem, "it could not be used")
    return (
        f"Your call to {call.name} was not run: {what} ({call.detail}). "
        "Call it again with one JSON object of arguments, all required parameters, and nothing else."
    )


def with_reminders(messages: Sequence[Message], reminders: Sequence[str]) -> list[Message]:
    """The request to send: the history plus this turn's reminders, without storing them.

    Joined to a trailing user message rather than added after it, because some
    chat templates refuse two user messages in a row.
    """
    request = list(messages)
    if not reminders:
        return request
    text = "\n".join(f"Reminder: {r}" for r in reminders)
    last = request[-1] if request else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        request[-1] = {**last, "content": f"{last['content']}\n\n{text}"}
    else:
        request.append({"role": "user", "content": text})
    return request
