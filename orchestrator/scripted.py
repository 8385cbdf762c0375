"""A deterministic model that replays a script, for tests and the struggle benchmark.

The same `Reply` script drives `ScriptedModel` (in-process, no HTTP) and
`orchestrator.fake_server.ScriptedServer` (an OpenAI-compatible server on
127.0.0.1 that real litellm talks to). It is never the product running.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from orchestrator.records import ModelResponse, RawToolCall
from orchestrator.tokens import estimate_prompt_tokens, estimate_tokens
from orchestrator.toolcalls import thinking_apart


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    `status` other than 200 makes the HTTP server answer with that error instead
    (with `text`, if any, as the error message, `error_type`, if any, as its `type`, and `error_fields`
    added to the error object: llama.cpp's `n_prompt_tokens` and `n_ctx`).
    `delay_s` is silence from the request's arrival to the first byte; `stall_s` silence after the first chunk.
    `chunk_interval_s` spaces the stream's chunks (a slow but living stream).
    `endless` streams that text over and over until the client hangs up (runaway output).
    """

    text: str = ""
    tool_calls: tuple[RawToolCall, ...] = ()
    status: int = 200
    delay_s: float = 0.0
    stall_s: float = 0.0
    chunk_chars: int = 16
    chunk_interval_s: float = 0.0
    endless: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    reasoning: str = ""
    error_type: str = ""
    error_fields: tuple[tuple[str, Any], ...] = ()


def say(text: str, **options: Any) -> Reply:
    """A reply with text and no tool call."""
    return Reply(text=text, **options)


def call(name: str, arguments: dict[str, Any] | str | None = None, **options: Any) -> Reply:
    """A reply making one native tool call; a str `arguments` is sent verbatim (may be broken)."""
    return calls((name, arguments), **options)


def calls(*pairs: tuple[str, dict[str, Any] | str | None], **options: Any) -> Reply:
    """A reply making several native tool calls at once."""
    raw = tuple(
        RawToolCall(name=name, arguments=_arguments_text(arguments), id=f"call_{index}")
        for index, (name, arguments) in enumerate(pairs)
    )
    return Reply(tool_calls=raw, **options)


def _arguments_text(arguments: dict[str, Any] | str | None) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments or {})


class ScriptedModel:
    """Replays replies in order; records every request it was given.

    When the script runs out it answers with an empty response, so a test that
    under-scripts sees `empty_response` rather than hanging.
    """

    def __init__(self, replies: Iterable[Reply] = ()) -> None:
        self._replies: deque[Reply] = deque(replies)
        self.requests: list[list[dict[str, Any]]] = []
        self.exhausted = 0

    def enqueue(self, *replies: Reply) -> None:
        self._replies.extend(replies)

    def complete(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        self.requests.append([dict(m) for m in messages])
        if not self._replies:
            self.exhausted += 1
            return ModelResponse(text="", prompt_tokens=estimate_prompt_tokens(messages))
        reply = self._replies.popleft()
        written = reply.text + "".join(c.name + c.arguments for c in reply.tool_calls)
        text, thought = thinking_apart(reply.text)  # as EndpointModel reads a server's answer
        return ModelResponse(
            text=text,
            tool_calls=reply.tool_calls,
            prompt_tokens=reply.prompt_tokens or estimate_prompt_tokens(messages),
            completion_tokens=reply.completion_tokens or estimate_tokens(written),
            finish_reason=reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"),
            reasoning="\n".join(filter(None, (reply.reasoning, thought))),
        )
