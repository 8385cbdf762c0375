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
from orchestrator.tokens import window_chars

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


# Tool output a request carries, as a share of a known context window (counted as the tools'
# output cap is, tokens.window_chars): the rest is the prompt, the tools' schemas, the turns and the answer.
KEPT_OUTPUT_SHARE = 0.4
# Once past it, the oldest outputs go until the rest fits this share: the request's beginning then stays
# as it was for the next turns, which a server's prompt cache (llama.cpp's) reuses instead of reading it again.
CUT_TO_SHARE = 0.2
# The newest results always go whole: what the model is working from now.
ALWAYS_KEPT = 2
# Short: one stands in every request for each output left out (the call is named in the turn before it).
LEFT_OUT = "[output left out to save room; call again if needed]"


def fitted(messages: Sequence[Message], context_window: int | None) -> list[Message]:
    """The history as the next request carries it: once the tools' output in it (the lines standing for
    outputs left out included) would pass KEPT_OUTPUT_SHARE of a known window, the oldest results are
    replaced by LEFT_OUT (the newest ALWAYS_KEPT whole) until it fits CUT_TO_SHARE, so that a small window
    is not filled by files read long ago. The history is replayed output by output, so what one request
    left out every later one leaves out too (the oldest first, never one back again): requests change
    only where the cut moves on, not at every turn. The history itself, and the transcript, keep everything."""
    request = list(messages)
    if not context_window:
        return request
    room, low = window_chars(context_window, KEPT_OUTPUT_SHARE), window_chars(context_window, CUT_TO_SHARE)
    # Tool results, and text-mode results and notes (user messages after the task's own, the second message).
    outputs = [i for i, m in enumerate(request) if m.get("role") == "tool" or (m.get("role") == "user" and i > 1)]
    sizes = [len(c) if isinstance(c := request[i].get("content"), str) else 0 for i in outputs]
    cut = kept = left = 0  # outputs[:cut] are left out; what the kept ones and the lines cost
    for newest, size in enumerate(sizes):
        kept += size
        if kept + left > room:
            while cut <= newest - ALWAYS_KEPT and kept + left > low:
                kept -= sizes[cut]
                left += min(sizes[cut], len(LEFT_OUT))
                cut += 1
    for index, size in zip(outputs[:cut], sizes):
        if size > len(LEFT_OUT):  # a shorter output stays: the line would cost more
            request[index] = {**request[index], "content": LEFT_OUT}
    return request


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
