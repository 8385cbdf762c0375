"""What a server's answer holds, read alike by both transports: JSON as attribute namespaces, an `error` in it,
an error body's message and kind (from one parse), and a whole body's answers (events or one JSON response)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from orchestrator.transports import CONTEXT_FULL, GARBLED, WRONG_SERVER, TransportError, kind_of, names_full_window

_EVENT_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")
# What json.loads raises for a body it cannot read: nested past Python's recursion limit ("[[[[..."), a server's
# garbage raised RecursionError, a traceback where a garbled answer or an error message was.
_NOT_READABLE = (ValueError, RecursionError)


def answers_in_body(body: bytes, status: int, media_type: str) -> list[Any]:
    """A whole body's answers, known by what it holds, not by its Content-Type: server-sent events
    (some servers label them text/plain or application/x-ndjson), or one JSON response; anything
    else (a web page on the wrong port) is no chat API's answer: read as one, it was an empty
    answer blamed on the model."""
    start = body.lstrip()[:8]
    if start.startswith(_EVENT_STARTS):
        events = (line[5:].strip() for line in body.splitlines() if line.startswith(b"data:"))
        return [answer_of(event) for event in events if event and event != b"[DONE]"]
    if start.startswith((b"{", b"[")) or (_is_json(media_type) and not start):
        return [answer_of(body)]
    raise TransportError(
        WRONG_SERVER,
        f"answered {status} with {media_type or 'no Content-Type'}, not a chat completion: is api_base the API's address (often ending in /v1)?",
        status,
    )


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


class OneChunk(list):
    """A whole response as a stream of one chunk (the model's reader takes a choice's message for its delta)."""

    def close(self) -> None:
        pass


def answer_of(payload: bytes) -> Any:
    """An event's JSON, or a whole response's; a top-level `error` in it is raised as the status error it stands for.

    Servers report a failure this way with status 200 (Ollama's "model not found", a model
    still loading); read as an answer it was empty, and blamed on the model.
    """
    answer = json_as_namespaces(payload)
    error = getattr(answer, "error", None)
    # "error": null, "" or {} in a normal answer is no error (the openai SDK reads it so too).
    if vars(error) if isinstance(error, SimpleNamespace) else error:
        said = read_error_body(payload.decode("utf-8", "replace"), fallback=payload[:200].decode("utf-8", "replace"))
        # Its own code when that is an HTTP error status; without one, a fault of the server's (retried).
        status = http_status(getattr(error, "code", None)) or 500
        raise TransportError(said.kind, said.message, status)
    return answer


_STATUS = re.compile(r"[0-9]{3}", re.ASCII)


def http_status(code: Any) -> int | None:
    """`code` as an HTTP error status (503, "503"), or None for anything else ("model_not_found", 7, null)."""
    if isinstance(code, str) and _STATUS.fullmatch(code):  # not isdigit: '²' passes it, and int() refuses it
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return code
    return None


def json_as_namespaces(data: str | bytes) -> Any:
    """JSON with objects as attribute namespaces, read the way the openai SDK's objects are."""
    if isinstance(data, bytes):
        # A server that cuts a character's bytes in two sends invalid UTF-8: that character is lost, not the answer.
        data = data.decode("utf-8", errors="replace")
    try:
        return json.loads(data, object_hook=lambda fields: SimpleNamespace(**fields))
    except _NOT_READABLE as exc:
        raise TransportError(GARBLED, f"the server sent something that is not JSON: {str(data)[:120]!r}") from exc


@dataclass(frozen=True)
class ErrorBody:
    """What an error body says: its message, on one line, and the kind of failure it reports."""

    message: str
    kind: str


def read_error_body(text: str, fallback: str) -> ErrorBody:
    """An OpenAI-style error body's message (the body itself, on one line, when it is not JSON; `fallback` when
    that is empty) and its kind: a full window where its `type` names one (llama.cpp's exceed_context_size_error,
    however its message is worded), else what its message says. The body is parsed once: it may be huge."""
    try:
        body = json.loads(text)
    except _NOT_READABLE:
        message = _one_line(text) or fallback
        return ErrorBody(message, kind_of(message))
    error = body.get("error", body) if isinstance(body, dict) else body
    said = (error.get("message") or error) if isinstance(error, dict) else error
    message = _one_line(str(said)) or fallback
    return ErrorBody(message, CONTEXT_FULL if names_full_window(error) else kind_of(message))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]
