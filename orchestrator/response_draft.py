"""A response put together from a server's chunks, whatever shape the server sent them in.

Servers differ in what they stream: content as a list of parts, arguments as an object, a call
split over deltas with or without an `index` (or every call at index 0), usage at the end or not
at all. Both transports hand on what the server sent; this is the one place that reads it into a
`ModelResponse`, and counts how far the answer has come for the silence watchdog and the runaway
cut-off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Sequence

from orchestrator.protocols import Message
from orchestrator.records import ModelResponse, RawToolCall
from orchestrator.runaway import WRITTEN_REPEAT_WINDOW, RepeatTail
from orchestrator.surrogates import mend
from orchestrator.tokens import estimate_prompt_tokens, estimate_tokens


@dataclass
class Channel:
    """One growing text (content, reasoning or a call's arguments), its recent tail watched for a loop."""

    parts: list[str] = field(default_factory=list)
    length: int = 0
    repeats: RepeatTail = field(default_factory=RepeatTail)

    def add(self, piece: str) -> None:
        self.parts.append(piece)
        self.length += len(piece)
        self.repeats.add(piece)

    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class CallDraft:
    id: str = ""
    name: str = ""
    arguments: Channel = field(default_factory=lambda: Channel(repeats=RepeatTail(window=WRITTEN_REPEAT_WINDOW)))


@dataclass
class Draft:
    """A response being put together from stream chunks (or one whole message)."""

    content: Channel = field(default_factory=lambda: Channel(repeats=RepeatTail(may_hold_calls=True)))
    reasoning: Channel = field(default_factory=Channel)
    calls: dict[int, CallDraft] = field(default_factory=dict)
    # Deltas without an index: the slot in `calls` that each place in a delta's list now continues.
    unindexed_slots: dict[int, int] = field(default_factory=dict)
    # Indexes a server gave to more than one call (Ollama's /v1 gives every call index 0): the slot each now continues.
    reused_index_slots: dict[int, int] = field(default_factory=dict)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add_chunk(self, chunk: Any) -> None:
        """A stream chunk; or a whole response, from a server that does not stream (its `message` for the delta)."""
        self.add_usage(getattr(chunk, "usage", None))
        for choice in _list(getattr(chunk, "choices", None)):
            delta = getattr(choice, "delta", None) or getattr(choice, "message", None)
            if delta is not None:
                self.add_message(delta)
            if getattr(choice, "finish_reason", None):
                self.finish_reason = str(choice.finish_reason)

    def add_message(self, message: Any) -> None:
        if getattr(message, "content", None):
            self.content.add(_as_text(message.content))
        # `reasoning` is how Ollama's /v1 and newer vLLM name it.
        reasoning = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
        if reasoning:
            self.reasoning.add(_as_text(reasoning))
        for position, call in enumerate(_list(getattr(message, "tool_calls", None))):
            self._add_call(position, call)

    def _add_call(self, position: int, call: Any) -> None:
        index = getattr(call, "index", None)
        if not isinstance(index, int):
            index = self._unindexed_slot(position, getattr(call, "id", None))
        else:
            index = self._reused_index_slot(index, call)
        draft = self.calls.setdefault(index, CallDraft())
        if getattr(call, "id", None) and not draft.id:
            draft.id = _as_text(call.id)
        function = getattr(call, "function", None)
        if function is None:
            return
        # Some servers repeat the name in every delta; it is never split.
        if getattr(function, "name", None) and not draft.name:
            draft.name = _as_text(function.name)
        if getattr(function, "arguments", None):
            draft.arguments.add(_arguments_text(function.arguments))

    def _unindexed_slot(self, position: int, call_id: Any) -> int:
        """Where a call delta without an `index` goes: the call last begun at its place in the list, or a
        new one when it carries another id. Servers that send each whole call in a chunk of its own, all
        at place 0, had their calls merged into one ('{"path": "a.py"}{"path": "b.py"}')."""
        slot = self.unindexed_slots.get(position, position)
        current = self.calls.get(slot)
        if call_id and current is not None and current.id and current.id != _as_text(call_id):
            slot = max(self.calls) + 1
            self.unindexed_slots[position] = slot
        return slot

    def _reused_index_slot(self, index: int, call: Any) -> int:
        """Where a call delta with an `index` goes: the call at that index; or a new one when the delta begins
        another call there (another id, and a name). Ollama's /v1 streams each whole call in a chunk of its
        own, every one at index 0: two reads were one call of '{"path": "a.py"}{"path": "b.py"}'."""
        slot = self.reused_index_slots.get(index, index)
        current = self.calls.get(slot)
        call_id, function = getattr(call, "id", None), getattr(call, "function", None)
        # A name too: a server that sent a new id with every piece of one call would otherwise split it.
        begins_a_call = bool(call_id) and bool(getattr(function, "name", None))
        if begins_a_call and current is not None and current.id and current.id != _as_text(call_id):
            slot = max(self.calls) + 1
            self.reused_index_slots[index] = slot
        return slot

    def add_usage(self, usage: Any) -> None:
        if usage is None:
            return
        self.prompt_tokens = _count(getattr(usage, "prompt_tokens", None)) or self.prompt_tokens
        self.completion_tokens = _count(getattr(usage, "completion_tokens", None)) or self.completion_tokens

    def progress(self) -> tuple[int, int, str]:
        """How far the answer has come: changes with every piece of text, reasoning, call or ending."""
        return self.written_chars(), sum(len(c.name) + 1 for c in self.calls.values()), self.finish_reason

    def written_chars(self) -> int:
        # Reasoning is output too: a model thinking on and on runs away as surely as one writing.
        return self.content.length + self.reasoning.length + sum(c.arguments.length for c in self.calls.values())

    def looping_unit(self) -> tuple[str, int] | None:
        for channel in (self.content, self.reasoning, *(c.arguments for c in self.calls.values())):
            unit = channel.repeats.looping_unit()
            if unit is not None:
                return unit
        return None

    def finish(self, messages: Sequence[Message], *, latency_s: float) -> ModelResponse:
        from orchestrator.toolcalls import thinking_apart

        # Thinking a server left in the text (no reasoning parser) is reasoning: the guards judge the answer.
        text, thought = thinking_apart(mend(self.content.text()))
        calls = tuple(
            RawToolCall(name=mend(c.name), arguments=mend(c.arguments.text()), id=c.id) for _, c in sorted(self.calls.items())
        )
        reasoning = "\n".join(filter(None, (mend(self.reasoning.text()), thought)))
        written = reasoning + text + "".join(c.name + c.arguments for c in calls)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            prompt_tokens=self.prompt_tokens or estimate_prompt_tokens(messages),
            completion_tokens=self.completion_tokens or estimate_tokens(written),
            latency_s=latency_s,
            finish_reason=self.finish_reason or ("tool_calls" if calls else "stop"),
            reasoning=reasoning,
        )


def _as_text(value: Any) -> str:
    """A field the API says is a string, as one, whatever a server sent: content as a list of
    parts, arguments as an object instead of its JSON text, a number; a part that is null, or
    whose text is, is no text (not the word "None")."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        return "".join(_as_text(_part_text(part)) for part in value)
    if isinstance(value, (dict, SimpleNamespace)):
        return _json_text(value)
    return str(value)


def _arguments_text(value: Any) -> str:
    """A call's arguments as JSON text, also when a server sent the object (or an array) itself:
    litellm hands those on as a dict or a list, whose Python repr is not JSON."""
    if isinstance(value, (dict, list, SimpleNamespace)):
        return _json_text(value)
    return _as_text(value)


def _part_text(part: Any) -> Any:
    """The text of one content part: {"type": "text", "text": ...} as a dict (litellm) or a namespace (direct)."""
    return part.get("text", "") if isinstance(part, dict) else getattr(part, "text", part)


def _json_text(value: Any) -> str:
    return json.dumps(value, default=vars, ensure_ascii=False)


def _list(value: Any) -> list[Any]:
    """A field the API says is a list (choices, tool calls), or [] for whatever else a server sent there."""
    if isinstance(value, list):
        return value
    return [value] if isinstance(value, SimpleNamespace) else []


def _count(value: Any) -> int:
    """A token count, or 0 for anything that is not a sane one (a string, null, NaN, below zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**53:
        return 0
    return int(value)


def read_whole(response: Any) -> Draft:
    """A response from a server that did not stream: its first choice, read as one chunk."""
    draft = Draft()
    draft.add_usage(getattr(response, "usage", None))
    for choice in _list(getattr(response, "choices", None)):
        message = getattr(choice, "message", None)
        if message is not None:
            draft.add_message(message)
        if getattr(choice, "finish_reason", None):
            draft.finish_reason = str(choice.finish_reason)
        break  # one choice asked for, one read
    return draft
