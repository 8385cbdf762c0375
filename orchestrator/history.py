"""How a model's turn is written into the conversation it will see next.

Two rules come from real servers: a tool call whose arguments did not parse is
never sent back as a tool call (llama.cpp answers HTTP 500 to its own broken
JSON in history), and reminders ride on the next request only.
"""

from __future__ import annotations

import json
import re
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
    if not call.name.strip():
        return (
            f"Your tool call was not run: it names no tool ({call.detail}). Write it as one JSON object, "
            'like {"name": "read_file", "arguments": {"path": "a.py"}}, and nothing else.'
        )
    return (
        f"Your call to {call.name} was not run: {what} ({call.detail}). "
        "Call it again with one JSON object of arguments, all required parameters, and nothing else."
    )


# Tool output a request carries, and long arguments of the model's earlier calls (a file written whole),
# as a share of a known context window (counted as the tools' output cap is, tokens.window_chars): the rest
# is the prompt, the tools' schemas, the turns' short parts and the answer.
KEPT_OUTPUT_SHARE = 0.4
# Once past it, the oldest go until the rest fits this share: the request's beginning then stays
# as it was for the next turns, which a server's prompt cache (llama.cpp's) reuses instead of reading it again.
CUT_TO_SHARE = 0.2
# The newest results, and the newest calls' arguments, always go whole: what the model is working from now.
ALWAYS_KEPT = 2
# Short: one stands in every request for each output left out (the call is named in the turn before it).
LEFT_OUT = "[output left out to save room; call again if needed]"
# A string in a call's arguments longer than this is weight (a file's content); a path or a command is not.
LONG_ARGUMENT_CHARS = 200
# A JSON string literal of that length or more where a value stands (after a key's `":`, or a name's `=`
# in a Python-form call), as arguments (native) or a written call (text) hold it. Anywhere else in a
# turn's text a quote can be a closing one of the model's prose (`"Error:" when ...`): the "string"
# from it would run over the call's own form.
_LONG_STRING = re.compile(r'("\s*:\s*|(?<=\w)\s*=\s*)("(?:[^"\\]|\\.){%d,}")' % LONG_ARGUMENT_CHARS, re.DOTALL)


def argument_left_out(chars: int) -> str:
    """What stands in an earlier call's arguments for a long string value (JSON string content)."""
    return f"[{chars} characters left out to save room]"


def fitted(messages: Sequence[Message], context_window: int | None) -> list[Message]:
    """The history as the next request carries it: once the tools' output in it and the long strings in
    the model's earlier calls' arguments (what stands for those left out included) would pass
    KEPT_OUTPUT_SHARE of a known window, the oldest are left out (outputs replaced by LEFT_OUT, long
    argument values by argument_left_out; the newest ALWAYS_KEPT of each whole) until it fits
    CUT_TO_SHARE, so that a small window is not filled by files read or written long ago. The history is
    replayed item by item, so what one request left out every later one leaves out too (the oldest first,
    never one back again): requests change only where the cut moves on, not at every turn. The history
    itself, and the transcript, keep everything."""
    request = list(messages)
    if not context_window:
        return request
    room, low = window_chars(context_window, KEPT_OUTPUT_SHARE), window_chars(context_window, CUT_TO_SHARE)
    # (index, is an output, chars carried whole, chars carried once left out), in the history's order:
    # tool results, text-mode results and notes (user messages after the task's own, the second message),
    # and the model's turns that carry long argument strings.
    items: list[tuple[int, bool, int, int]] = []
    for index, message in enumerate(request):
        if message.get("role") == "tool" or (message.get("role") == "user" and index > 1):
            size = len(content) if isinstance(content := message.get("content"), str) else 0
            items.append((index, True, size, min(size, len(LEFT_OUT))))
        elif message.get("role") == "assistant":
            whole = shortened = 0
            for literal in _long_strings(message):
                whole += len(literal)
                shortened += len(argument_left_out(len(literal) - 2)) + 2
            if whole:
                items.append((index, False, whole, shortened))
    out: set[int] = set()  # positions in items of those left out
    kept = left = 0  # what the kept ones and the stand-ins cost
    for newest, (_, _, size, _) in enumerate(items):
        kept += size
        if kept + left > room:
            # The newest of each kind are passed over, not a wall: one file written early would
            # otherwise keep every output after it in the request.
            protected = _newest_of_each_kind(items[: newest + 1])
            for oldest in range(newest + 1):
                if kept + left <= low:
                    break
                if oldest not in out and oldest not in protected:
                    kept -= items[oldest][2]
                    left += items[oldest][3]
                    out.add(oldest)
    for index, is_output, size, _ in (items[at] for at in sorted(out)):
        if not is_output:
            request[index] = _without_long_strings(request[index])
        elif size > len(LEFT_OUT):  # a shorter output stays: the line would cost more
            request[index] = {**request[index], "content": LEFT_OUT}
    return request


def _newest_of_each_kind(items: Sequence[tuple[int, bool, int, int]]) -> set[int]:
    """Positions in `items` of the newest ALWAYS_KEPT outputs and the newest ALWAYS_KEPT calls' arguments."""
    outputs = [at for at, item in enumerate(items) if item[1]]
    calls = [at for at, item in enumerate(items) if not item[1]]
    return set(outputs[-ALWAYS_KEPT:]) | set(calls[-ALWAYS_KEPT:])


def _long_strings(message: Message) -> list[str]:
    texts = [message.get("content")] + [(call.get("function") or {}).get("arguments") for call in message.get("tool_calls") or ()]
    return [found.group(2) for text in texts if isinstance(text, str) for found in _LONG_STRING.finditer(text)]


def _shorten(text: object) -> object:
    if not isinstance(text, str):
        return text
    return _LONG_STRING.sub(lambda found: f'{found.group(1)}"{argument_left_out(len(found.group(2)) - 2)}"', text)


def _without_long_strings(message: Message) -> Message:
    """`message` (a turn of the model's) with each long JSON string in its text and calls' arguments left out:
    the arguments stay valid JSON, the call's name and its short arguments (a path) as they were."""
    shortened: Message = {**message, "content": _shorten(message.get("content"))}
    if message.get("tool_calls"):
        shortened["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": _shorten(call["function"].get("arguments"))}}
            if isinstance(call.get("function"), dict) else call
            for call in message["tool_calls"]
        ]
    return shortened


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
